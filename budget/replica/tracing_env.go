package replica

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// The OTEL_ variables the SDK and the OTLP exporters read on their own
// when tracing is on. They ignore a value they cannot use (with a line on
// the standard logger at best) or, worse, take it as it is: a negative
// OTEL_BSP_MAX_QUEUE_SIZE panics in make(chan), an endpoint without a
// scheme parses as a URL without a host and the exporter sends to its
// default, localhost. So checkTracingEnv reads each of them first, as the
// SDK would, and refuses at startup what the SDK would misread, naming the
// variable: an operator learns of a typo when serve starts, not by finding
// no spans (or a crash) later.
const (
	envBSPScheduleDelay  = "OTEL_BSP_SCHEDULE_DELAY"
	envBSPExportTimeout  = "OTEL_BSP_EXPORT_TIMEOUT"
	envBSPMaxQueueSize   = "OTEL_BSP_MAX_QUEUE_SIZE"
	envBSPMaxExportBatch = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
	envResourceAttrs     = "OTEL_RESOURCE_ATTRIBUTES"
	otlpPrefix           = "OTEL_EXPORTER_OTLP_"
)

// The batch processor's defaults (sdktrace.DefaultMaxQueueSize and
// DefaultMaxExportBatchSize), against which a batch size alone is checked.
const (
	defaultBSPQueue = 2048
	defaultBSPBatch = 512
)

// maxBSPQueue bounds OTEL_BSP_MAX_QUEUE_SIZE: the queue is allocated whole
// at startup (a channel of that many spans), so a stray digit must not
// reserve gigabytes. A million spans is far past any export rate a replica
// makes between two batches.
const maxBSPQueue = 1 << 20

// maxMillis bounds the variables in milliseconds: a day, far past any
// sensible delay or timeout, and far from time.Duration's overflow.
const maxMillis = 24 * 3600 * 1000

// spanLimitVars are the span limits the SDK reads (sdktrace.NewSpanLimits);
// each is a count or a length, a non-negative integer as the
// specification says (unset is the SDK's default).
var spanLimitVars = []string{
	"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
}

// checkTracingEnv refuses the OTEL_ variables that the SDK or the
// exporters would misread (the ones TracingFromEnv reads itself it checks
// as it reads them). Each error names the variable and its value.
func checkTracingEnv() error {
	for _, check := range []func() error{checkOTLPEnv, checkBSPEnv, checkSpanLimitsEnv, checkResourceEnv} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// envError is the error of one variable: its name, its value and what it
// should be.
func envError(name, value, want string) error {
	return fmt.Errorf("%s=%q: %s", name, value, want)
}

// intEnv reads name as the SDK does (no trimming: the SDK's strconv.Atoi
// refuses " 5" and falls back to its default), within [lo, hi]; ok is false
// when it is unset or empty.
func intEnv(name string, lo, hi int, want string) (n int, ok bool, err error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, false, nil
	}
	n, err = strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, false, envError(name, v, want)
	}
	return n, true, nil
}

func checkBSPEnv() error {
	if _, _, err := intEnv(envBSPScheduleDelay, 1, maxMillis, "the delay between two exports in milliseconds, a whole number from 1 to 86400000"); err != nil {
		return err
	}
	if _, _, err := intEnv(envBSPExportTimeout, 1, maxMillis, "the export timeout in milliseconds, a whole number from 1 to 86400000"); err != nil {
		return err
	}
	queue, set, err := intEnv(envBSPMaxQueueSize, 1, maxBSPQueue, fmt.Sprintf("the spans held for export, a whole number from 1 to %d", maxBSPQueue))
	if err != nil {
		return err
	}
	if !set {
		queue = defaultBSPQueue
	}
	// The SDK silently shrinks a batch larger than the queue; the
	// specification says it must not be.
	_, _, err = intEnv(envBSPMaxExportBatch, 1, queue,
		fmt.Sprintf("the spans per export, a whole number from 1 to %s (%d)", envBSPMaxQueueSize, queue))
	return err
}

func checkSpanLimitsEnv() error {
	for _, name := range spanLimitVars {
		if _, _, err := intEnv(name, 0, math.MaxInt32, "a whole number from 0 (unset for the default)"); err != nil {
			return err
		}
	}
	return nil
}

// checkResourceEnv refuses the OTEL_RESOURCE_ATTRIBUTES pairs the SDK
// drops or keeps undecoded: each is key=value, the value percent-encoded.
func checkResourceEnv() error {
	v := strings.TrimSpace(os.Getenv(envResourceAttrs))
	if v == "" {
		return nil
	}
	for _, p := range strings.Split(v, ",") {
		k, val, found := strings.Cut(p, "=")
		if !found || strings.TrimSpace(k) == "" {
			return envError(envResourceAttrs, v, fmt.Sprintf("%q is not key=value: want comma-separated key=value pairs", p))
		}
		if _, err := url.PathUnescape(strings.TrimSpace(val)); err != nil {
			return envError(envResourceAttrs, v, fmt.Sprintf("the value of %q is not percent-encoded: %v", strings.TrimSpace(k), err))
		}
	}
	return nil
}

// checkOTLPEnv checks the exporter's variables, general and _TRACES_ alike
// (the exporters read both, the second winning).
func checkOTLPEnv() error {
	for _, sig := range []string{"", "TRACES_"} {
		get := func(name string) (string, string) {
			k := otlpPrefix + sig + name
			return k, strings.TrimSpace(os.Getenv(k)) // the exporters trim
		}
		if k, v := get("ENDPOINT"); v != "" {
			if err := checkEndpoint(k, v); err != nil {
				return err
			}
		}
		if k, v := get("PROTOCOL"); v != "" && v != "grpc" && v != "http/protobuf" {
			return envError(k, v, "use grpc or http/protobuf")
		}
		if k, v := get("COMPRESSION"); v != "" && v != "gzip" && v != "none" {
			return envError(k, v, "use gzip or none")
		}
		if k, v := get("INSECURE"); v != "" && !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
			return envError(k, v, "use true or false")
		}
		if k, v := get("TIMEOUT"); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n < 1 || n > maxMillis {
				return envError(k, v, "the export timeout in milliseconds, a whole number from 1 to 86400000")
			}
		}
		if k, v := get("HEADERS"); v != "" {
			if err := checkHeaders(k, v); err != nil {
				return err
			}
		}
		if k, v := get("CERTIFICATE"); v != "" {
			pem, err := os.ReadFile(v)
			if err != nil {
				return envError(k, v, fmt.Sprintf("the CA certificate file cannot be read: %v", err))
			}
			if !x509.NewCertPool().AppendCertsFromPEM(pem) {
				return envError(k, v, "the file holds no PEM certificate")
			}
		}
		kc, vc := get("CLIENT_CERTIFICATE")
		kk, vk := get("CLIENT_KEY")
		switch {
		case vc == "" && vk == "":
		case vc == "" || vk == "":
			return fmt.Errorf("%s and %s: set both or neither (the exporter ignores one alone)", kc, kk)
		default:
			if _, err := tls.LoadX509KeyPair(vc, vk); err != nil {
				return fmt.Errorf("%s=%q, %s=%q: %w", kc, vc, kk, vk, err)
			}
		}
	}
	return nil
}

// checkEndpoint requires a URL with the scheme http or https and a host.
// The specification has OTLP exporters accept such a URL for both
// protocols (a scheme-less host:port is left to the gRPC client, and the
// Go exporter reads "collector:4317" as the scheme "collector" and no
// host, so it exports to its default, localhost): the scheme also says
// whether the connection is encrypted, which must not be guessed.
func checkEndpoint(name, v string) error {
	const want = "want a URL with the scheme http:// or https:// and a host, such as http://collector:4318"
	u, err := url.Parse(v)
	if err != nil {
		return envError(name, v, want)
	}
	if s := strings.ToLower(u.Scheme); (s != "http" && s != "https") || u.Host == "" {
		return envError(name, v, want)
	}
	return nil
}

// checkHeaders checks comma-separated name=value pairs, names HTTP tokens
// and values percent-encoded, as the exporter parses them (it drops any
// other pair with a line on the standard logger).
func checkHeaders(name, v string) error {
	for _, p := range strings.Split(v, ",") {
		k, val, found := strings.Cut(p, "=")
		k = strings.TrimSpace(k)
		if !found || k == "" || strings.IndexFunc(k, func(r rune) bool { return !isTokenRune(r) }) >= 0 {
			return fmt.Errorf("%s: a pair is not name=value with a header name: want comma-separated name=value pairs (the value is not shown: it may hold a secret)", name)
		}
		if _, err := url.PathUnescape(val); err != nil {
			return fmt.Errorf("%s: the value of %s is not percent-encoded (the value is not shown: it may hold a secret)", name, k)
		}
	}
	return nil
}

// isTokenRune says whether r may be in an HTTP header name (RFC 9110's
// tchar).
func isTokenRune(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}
