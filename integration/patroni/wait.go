package patroni

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// healthy reports whether, among the members but those in down, exactly
// one runs as the leader, one streams as its synchronous standby, and
// want of them are up in all.
func healthy(ms []Member, want int, down []string) bool {
	var leaders, syncs, n int
	for _, m := range ms {
		if slices.Contains(down, m.Name) {
			continue
		}
		if !m.up() {
			return false
		}
		n++
		switch m.Role {
		case "leader", "master", "primary":
			leaders++
		case "sync_standby":
			syncs++
		}
	}
	return leaders == 1 && syncs == 1 && n == want
}

// WaitHealthy waits up to timeout until every node but those in down is up:
// one leader, one synchronous standby, and the rest streaming replicas. It
// returns the members as last seen.
func (c *Cluster) WaitHealthy(ctx context.Context, timeout time.Duration, down ...string) ([]Member, error) {
	want := len(c.names) - len(down)
	return c.waitMembers(ctx, timeout, fmt.Sprintf("%d nodes up with a leader and a synchronous standby", want), func(ms []Member) bool {
		return healthy(ms, want, down)
	})
}

// WaitLeader waits up to timeout for a failover away from old: a leader
// other than old that runs, and a synchronous standby other than old that
// is up. It returns the new leader.
func (c *Cluster) WaitLeader(ctx context.Context, timeout time.Duration, old string) (string, error) {
	var leader string
	_, err := c.waitMembers(ctx, timeout, "a new leader and a synchronous standby", func(ms []Member) bool {
		leader = ""
		sync := false
		for _, m := range ms {
			if m.Name == old || !m.up() {
				continue
			}
			switch m.Role {
			case "leader", "master", "primary":
				leader = m.Name
			case "sync_standby":
				sync = true
			}
		}
		return leader != "" && sync
	})
	return leader, err
}

func (c *Cluster) waitMembers(ctx context.Context, timeout time.Duration, what string, ok func([]Member) bool) ([]Member, error) {
	deadline := time.Now().Add(timeout)
	for {
		ms, err := c.Members(ctx)
		if err == nil && ok(ms) {
			return ms, nil
		}
		if time.Now().After(deadline) {
			return ms, fmt.Errorf("patroni: timed out after %s waiting for %s: members %+v, %v", timeout, what, ms, err)
		}
		select {
		case <-ctx.Done():
			return ms, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
