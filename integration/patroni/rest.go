package patroni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

var restClient = &http.Client{}

// rest calls a node's Patroni REST API and decodes a JSON answer into out.
// A GET is given 3 s; a POST (a switchover, which Patroni answers once it
// is over) a minute.
func (c *Cluster) rest(ctx context.Context, name, method, path string, body, out any) error {
	timeout := 3 * time.Second
	if method != http.MethodGet {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hp, err := c.hostPort(ctx, name, "8008/tcp")
	if err != nil {
		return err
	}
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+hp+path, rd)
	if err != nil {
		return err
	}
	resp, err := restClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("patroni: %s %s on %s: %d %s", method, path, name, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("patroni: %s %s on %s: %w: %s", method, path, name, err, raw)
		}
	}
	return nil
}

// running says whether a node's container runs (not killed, not stopped,
// not paused).
func (c *Cluster) running(ctx context.Context, name string) bool {
	st, err := c.nodes[name].State(ctx)
	return err == nil && st.Running && !st.Paused
}

// Members is the cluster as Patroni keeps it in etcd (GET /cluster), asked
// of each running node in turn.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	var last error = errors.New("no node runs")
	for _, name := range c.names {
		if !c.running(ctx, name) {
			continue
		}
		var v struct {
			Members []Member `json:"members"`
		}
		if err := c.rest(ctx, name, http.MethodGet, "/cluster", nil, &v); err != nil {
			last = err
			continue
		}
		return v.Members, nil
	}
	return nil, fmt.Errorf("patroni: GET /cluster: %w", last)
}

// Primary returns the name of the node that leads now.
func (c *Cluster) Primary(ctx context.Context) (string, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.Role == "leader" {
			return m.Name, nil
		}
	}
	return "", fmt.Errorf("patroni: no leader among %+v", ms)
}

// Switchover hands the leadership from the primary to the synchronous
// standby (POST /switchover, which Patroni answers once the standby
// leads), and returns both names. In synchronous mode only the
// synchronous standby may take over.
func (c *Cluster) Switchover(ctx context.Context) (from, to string, err error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return "", "", err
	}
	for _, m := range ms {
		switch m.Role {
		case "leader":
			from = m.Name
		case "sync_standby":
			to = m.Name
		}
	}
	if from == "" || to == "" {
		return "", "", fmt.Errorf("patroni: a switchover needs a leader and a synchronous standby: %+v", ms)
	}
	req := map[string]string{"leader": from, "candidate": to}
	if err := c.rest(ctx, from, http.MethodPost, "/switchover", req, nil); err != nil {
		return from, to, err
	}
	return from, to, nil
}

// Configure changes the cluster's dynamic configuration (PATCH /config on
// the primary, which Patroni applies to every node): patch is merged into
// it, e.g. {"postgresql": {"parameters": {"synchronous_commit": "local"}}}.
func (c *Cluster) Configure(ctx context.Context, patch map[string]any) error {
	primary, err := c.Primary(ctx)
	if err != nil {
		return err
	}
	return c.rest(ctx, primary, http.MethodPatch, "/config", patch, nil)
}
