package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/replica"
)

// serveProxy starts the OpenAI-compatible proxy (serve --proxy-addr) on the
// replica's own admission layer, so its calls share the replica's
// pipelines, failure policies and spool with the HTTP API and the rate
// limit service. The returned stop lets streams in flight finish, and
// settle, for up to the shutdown timeout.
func (s serveCmd) serveProxy(g *globals, rep *replica.Replica, srv *api.Server) (func(), error) {
	logger := rep.Logger
	if s.Upstream == "" && s.AnthropicUpstream == "" && s.GeminiUpstream == "" {
		return nil, errors.New("--proxy-addr needs --upstream, --anthropic-upstream or --gemini-upstream, an http(s) URL")
	}
	upstream, err := upstreamURL("--upstream", s.Upstream)
	if err != nil {
		return nil, err
	}
	anthropic, err := upstreamURL("--anthropic-upstream", s.AnthropicUpstream)
	if err != nil {
		return nil, err
	}
	gemini, err := upstreamURL("--gemini-upstream", s.GeminiUpstream)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", s.ProxyAddr)
	if err != nil {
		return nil, fmt.Errorf("--proxy-addr %s: %w", s.ProxyAddr, err)
	}
	p := proxy.New(rep, proxy.Config{Upstream: upstream, UpstreamKey: s.UpstreamKey, AnthropicUpstream: anthropic, AnthropicKey: s.AnthropicKey,
		GeminiUpstream: gemini, GeminiKey: s.GeminiKey,
		CountTokensUpstream: s.CountTokens == "upstream", ClientAddr: srv.ClientAddr, BodyLimit: s.BodyLimit})
	hs := &http.Server{Handler: p}
	s.httpTimeouts().Apply(hs)
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("proxy stopped", "error", err.Error())
		}
	}()
	if upstream != nil {
		fmt.Fprintf(g.stderr, "tokengate OpenAI-compatible proxy on %s, forwarding to %s\n", displayURL(ln.Addr()), upstream.Redacted())
	}
	if anthropic != nil {
		fmt.Fprintf(g.stderr, "tokengate Anthropic Messages proxy on %s, forwarding to %s\n", displayURL(ln.Addr()), anthropic.Redacted())
	}
	if gemini != nil {
		fmt.Fprintf(g.stderr, "tokengate Gemini API proxy on %s, forwarding to %s\n", displayURL(ln.Addr()), gemini.Redacted())
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			logger.Error("proxy shutdown did not finish in time", "error", err.Error())
		}
	}, nil
}

// upstreamURL parses an upstream flag's value: empty is none (nil), else
// an http(s) URL with a host.
func upstreamURL(flag, raw string) (*url.URL, error) {
	if raw == "" {
		return nil, nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s must be an http(s) URL (got %q)", flag, raw)
	}
	return u, nil
}

// httpTimeouts are the timeouts of every HTTP server of the replica.
func (s serveCmd) httpTimeouts() api.HTTPTimeouts {
	return api.HTTPTimeouts{BodyRead: s.BodyReadTimeout}
}

// proxyCmd is `tokengate proxy --upstream URL`: a replica with the proxy
// on (at :8082 unless --proxy-addr says otherwise). It is serve itself,
// HTTP API and dashboard included, so the proxy's calls are decided,
// journaled and shown exactly as every other admission.
type proxyCmd struct {
	serveCmd `embed:""`
}

func (c proxyCmd) Run(ctx context.Context, g *globals) error {
	if c.ProxyAddr == "" {
		c.ProxyAddr = ":8082"
	}
	return c.serveCmd.Run(ctx, g)
}
