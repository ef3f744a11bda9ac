// Package estimator predicts the token cost of an OpenAI-style request
// before it runs.
//
// tokengate admits a request only if its tenant can pay for it, so the
// estimate is computed first, outside and before the budget transaction:
// the tenant's row lock is then held for a debit of a known amount, never
// for tokenization. The estimate must therefore be cheap, deterministic and
// impossible to talk down.
//
// Input tokens are exact tiktoken counts in the model's encoding
// (o200k_base or cl100k_base), with the message and tool framing of OpenAI's
// cookbook (num_tokens_from_messages, num_tokens_for_tools). A caller may
// raise the input figure with input_tokens (to cover images, audio and
// files, which have no text), never lower it. Output tokens are the
// request's own cap, or the model's default, times the number of choices.
// An embeddings call ([ParseEmbeddings]) is input only: each of its inputs
// is counted exactly and held to the model's window, and no output is
// reserved.
//
// Costs are integers. Weights are fixed point in micro units (WeightOne is
// 1.0) and cost is ceil((in*inW + out*outW) / 1e6) in 128-bit integer
// arithmetic, so the same request always debits the same amount on every
// replica and rounding never favours the tenant.
//
// Tokenization uses the ranks embedded by tiktoken-go-loader, loaded once
// per process per encoding on first use, and a linear-time splitter and
// merger checked token for token against tiktoken-go in the tests.
//
// Counting stops as soon as a request is proven over its model's window
// (countLimit), and a replica's [Gate] bounds the body bytes its faces
// parse and count at once, with a share per tenant: the memory of an
// estimate is a multiple of its body, so bounding the bytes bounds it.
//
// It imports none of the module's packages: every other package may use it.
package estimator
