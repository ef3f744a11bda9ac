package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/tokengate/tokengate/cmd/tokengate/loadgen"
)

// loadgenCmd drives a running tokengate like a gateway does. It needs no
// database, only keys.
type loadgenCmd struct {
	URLs        []string      `name:"url" default:"http://localhost:8080" help:"tokengate's base URL (repeat for several replicas; workers take them round-robin)."`
	Keys        []string      `name:"key" env:"TG_KEY" required:"" help:"Tenant key(s); workers take them round-robin."`
	Concurrency int           `name:"concurrency" default:"32" help:"Requests in flight."`
	Duration    time.Duration `name:"duration" default:"10s" help:"How long to run."`
	Rate        float64       `name:"rate" default:"0" help:"Admissions per second in all (0: as fast as possible)."`
	Model       string        `name:"model" default:"gpt-4o-mini" help:"Model of the requests."`
	MaxTokens   int           `name:"max-tokens" default:"100" help:"max_tokens of the requests."`
	Settle      bool          `name:"settle" default:"true" negatable:"" help:"Settle each admission with usage."`
	JSON        bool          `name:"json" help:"Print the report as JSON (for scripts)."`
}

func (c loadgenCmd) Run(ctx context.Context, g *globals) error {
	r, err := loadgen.Run(ctx, loadgen.Config{URLs: c.URLs, Keys: c.Keys, Concurrency: c.Concurrency, Duration: c.Duration,
		Rate: c.Rate, Model: c.Model, MaxTokens: c.MaxTokens, Settle: c.Settle})
	if err != nil {
		return err
	}
	if c.JSON {
		return json.NewEncoder(g.stdout).Encode(r)
	}
	fmt.Fprintln(g.stdout, r)
	return nil
}
