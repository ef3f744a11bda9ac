package client_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"

	"github.com/tokengate/tokengate/api/client"
)

// A frontend admits each request before the model runs and settles it with
// what the model reported.
func ExampleClient_Reserve() {
	tg, err := client.New(client.Config{BaseURL: "http://tokengate:8080", Key: os.Getenv("TOKENGATE_KEY")})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	a, err := tg.Reserve(ctx, client.Request{Body: []byte(`{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"hello"}]}`)})
	var refused *client.Error
	if errors.As(err, &refused) && refused.Rejected() {
		log.Printf("over the tenant's %s limit; retry after %v", refused.Limit, refused.RetryAfter)
		return
	} else if err != nil {
		log.Fatal(err)
	}
	// ... run the model ...
	if _, err := tg.Settle(ctx, a, client.Usage{InputTokens: 9, OutputTokens: 12}); err != nil {
		log.Print(err) // unsettled, it expires at its TTL, charged at its estimate
	}
}

// Middleware admits before the handler and settles from what it reports.
func ExampleClient_Middleware() {
	tg, err := client.New(client.Config{BaseURL: "http://tokengate:8080", Key: os.Getenv("TOKENGATE_KEY")})
	if err != nil {
		log.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// r.Body is the request, intact; call the model with it.
		client.ReportUsage(r.Context(), client.Usage{InputTokens: 40, OutputTokens: 25})
		w.Write([]byte("the model's answer"))
	})
	http.Handle("/v1/chat/completions", tg.Middleware(client.MiddlewareConfig{})(handler))
	log.Fatal(http.ListenAndServe(":9000", nil))
}
