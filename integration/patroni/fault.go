package patroni

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
)

// Kill is `docker kill`: SIGKILL to Patroni and Postgres at once, with no
// shutdown; a primary's leader key is left to expire (ttl 10 s), and
// then Patroni promotes the synchronous standby.
func (c *Cluster) Kill(ctx context.Context, name string) error {
	return c.docker(ctx, "kill", name)
}

// Start starts a killed or stopped node again with its data as it was: an
// old primary rejoins as a replica of the new one (pg_rewind, or a new
// base backup when the rewind fails).
func (c *Cluster) Start(ctx context.Context, name string) error {
	return c.docker(ctx, "start", name)
}

func (c *Cluster) docker(ctx context.Context, verb, name string) error {
	ctr, ok := c.nodes[name]
	if !ok {
		return fmt.Errorf("patroni: no node %q", name)
	}
	if out, err := exec.CommandContext(ctx, "docker", verb, ctr.GetContainerID()).CombinedOutput(); err != nil {
		return fmt.Errorf("patroni: docker %s %s: %w: %s", verb, name, err, bytes.TrimSpace(out))
	}
	return nil
}
