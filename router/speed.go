package router

import (
	"math"
	"time"
)

// SpeedPoint is one measurement of a worker at a given concurrency: from a
// bench, from the engine's metrics, or from the router's own traffic.
type SpeedPoint struct {
	Concurrency int
	// TTFT for a prompt of PromptTokens tokens.
	TTFT         time.Duration
	PromptTokens int
	// ITL is the mean time per output token after the first.
	ITL time.Duration
	// PrefillTokPerSec is the engine's prompt processing speed, when known
	// (llama-server timings, vLLM prompt token counters).
	PrefillTokPerSec float64
}

// SpeedPrior is what the model assumes about a worker it has never measured.
// It is deliberately optimistic so that an unmeasured worker gets a few
// requests and is then judged on what they show.
type SpeedPrior struct {
	TTFT             time.Duration // default 100 ms
	ITL              time.Duration // default 15 ms
	PrefillTokPerSec float64       // default 1000
}

// SpeedModel predicts a worker's TTFT and per-token time as functions of
// its concurrency and the prompt length. It learns online from measurements:
// each concurrency level keeps a running estimate that starts as a mean and
// settles into an exponentially decaying average, with outliers clipped to a
// factor of the current estimate, so one stalled request cannot swing it.
// Levels never measured are inferred from the nearest measured ones.
//
// It has no clock and no lock: the router calls it under its own lock, and
// the simulator calls it in virtual time.
type SpeedModel struct {
	prior SpeedPrior
	// base[c-1] is TTFT minus prefill at concurrency c, in ms.
	base [speedLevels]estimate
	// itl[c-1] is ms per output token at mean concurrency c.
	itl [speedLevels]estimate
	// prefill[c-1] is ms per computed prompt token at concurrency c: a
	// prefill shares its engine with the requests beside it (a one-thread
	// llama-server given two 4,000-token prompts at once computes the
	// second at 1.5 to 2.3 times its rate alone), so one rate for every
	// load prices a long prefill on a busy worker at the mix of the loads
	// it was learned at.
	prefill [speedLevels]estimate
	// longPrefills counts the prefill observations of at least
	// longPrefillTokens: until there is one, the rate is mostly the fixed
	// cost of short prompts spread over their tokens.
	longPrefills int
}

// longPrefillTokens is the prompt length from which a prefill teaches the
// rate long prompts see (minPrefillSample, for the engine's own timings).
const longPrefillTokens = minPrefillSample

// speedLevels bounds the concurrency levels tracked; beyond it the last
// level's trend extrapolates.
const speedLevels = 64

// estimate is a robust, decaying running average.
type estimate struct {
	v float64
	n int
}

const (
	// minAlpha sets the memory of an estimate: about the last 1/minAlpha
	// observations matter.
	minAlpha = 0.1
	// clipFactor bounds how far one observation can pull an estimate.
	clipFactor = 4.0
	// seedWeight is how many observations a seeded value counts as, so
	// live traffic overrides a bench within a few requests.
	seedWeight = 3
)

func (e *estimate) add(x float64) {
	if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
		return
	}
	if e.n == 0 {
		e.v, e.n = x, 1
		return
	}
	if e.v > 0 {
		x = min(max(x, e.v/clipFactor), e.v*clipFactor)
	}
	alpha := max(1/float64(e.n+1), minAlpha)
	e.v += alpha * (x - e.v)
	e.n++
}

func (e *estimate) seed(x float64) {
	if x <= 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return
	}
	e.v, e.n = x, seedWeight
}

// NewSpeedModel returns a model that knows only its prior.
func NewSpeedModel(prior SpeedPrior) *SpeedModel {
	if prior.TTFT <= 0 {
		prior.TTFT = 100 * time.Millisecond
	}
	if prior.ITL <= 0 {
		prior.ITL = 15 * time.Millisecond
	}
	if prior.PrefillTokPerSec <= 0 {
		prior.PrefillTokPerSec = 1000
	}
	return &SpeedModel{prior: prior}
}

func level(c int) int { return min(max(c, 1), speedLevels) - 1 }

// Seed sets the model's figures at p's concurrency from a bench or the
// engine's metrics.
func (m *SpeedModel) Seed(p SpeedPoint) {
	if p.PrefillTokPerSec > 0 {
		m.prefill[level(p.Concurrency)].seed(1000 / p.PrefillTokPerSec)
	}
	if p.TTFT > 0 {
		m.base[level(p.Concurrency)].seed(max(ms(p.TTFT)-float64(p.PromptTokens)*m.prefillMs(p.Concurrency), 0.01))
	}
	if p.ITL > 0 {
		m.itl[level(p.Concurrency)].seed(ms(p.ITL))
	}
}

// Observe learns from one finished request. startConcurrency is the
// worker's in-flight count when it started (itself included); meanConcurrency
// is the time-average over its life, which is what its decode speed saw.
func (m *SpeedModel) Observe(startConcurrency int, meanConcurrency float64, promptTokens int, ttft, itl time.Duration) {
	pre := m.prefillMs(startConcurrency)
	if ttft > 0 {
		b := &m.base[level(startConcurrency)]
		// Long prompts carry information about prefill speed: attribute
		// what the base does not explain to the prompt.
		if promptTokens >= 64 && b.n > 0 {
			m.prefill[level(startConcurrency)].add(max(ms(ttft)-b.v, 0) / float64(promptTokens))
			pre = m.prefillMs(startConcurrency)
			if promptTokens >= longPrefillTokens {
				m.longPrefills++
			}
		}
		b.add(max(ms(ttft)-float64(promptTokens)*pre, 0.01))
	}
	if itl > 0 {
		c := int(math.Round(meanConcurrency))
		m.itl[level(c)].add(ms(itl))
	}
}

// ObservePrefill learns the prefill rate at concurrency c (the worker's
// in-flight count when the request started, itself included) from the
// engine's own timings: tokens computed in ms (llama-server's prompt_n and
// prompt_ms, which count the time the slots beside it took).
func (m *SpeedModel) ObservePrefill(c, tokens int, ms float64) {
	if tokens > 0 && ms > 0 {
		m.prefill[level(c)].add(ms / float64(tokens))
		if tokens >= longPrefillTokens {
			m.longPrefills++
		}
	}
}

// CautiousTTFT is TTFT for deciding that a worker is silent: a prompt of
// longPrefillTokens or more, on a worker that has not prefilled one yet, is
// priced at no faster than the prior's rate. Learned from short prompts
// only (an admission bench, chat), the rate is their fixed cost spread over
// few tokens, often ten times faster than a long prompt really goes, and a
// healthy worker's first long prompt would miss its deadline, be taken back
// and leave the worker suspect.
func (m *SpeedModel) CautiousTTFT(c, promptTokens int) time.Duration {
	pre := m.prefillMs(c)
	if promptTokens >= longPrefillTokens && m.longPrefills == 0 {
		pre = max(pre, 1000/m.prior.PrefillTokPerSec)
	}
	return m.ttft(c, promptTokens, pre)
}

// prefillMs is ms per prompt token at concurrency c. A level never measured
// takes its measured neighbours' rate (interpolated between two, the
// nearest one's beyond them), not a guessed slowdown: how much a prefill
// slows beside others ranges from little (a GPU batching a prefill with
// decodes) to 1/c (a CPU engine's slots), and the first measurement at a
// level says which.
func (m *SpeedModel) prefillMs(c int) float64 {
	return m.levelValueExp(&m.prefill, c, 1000/m.prior.PrefillTokPerSec, 0)
}

// TTFT predicts the time to first token at concurrency c (the request
// itself included) for a prompt of promptTokens.
func (m *SpeedModel) TTFT(c, promptTokens int) time.Duration {
	return m.ttft(c, promptTokens, m.prefillMs(c))
}

// ttft is TTFT at a prefill of prefillMs per prompt token.
func (m *SpeedModel) ttft(c, promptTokens int, prefillMs float64) time.Duration {
	base := m.levelValue(&m.base, c, ms(m.prior.TTFT))
	return fromMs(base + float64(promptTokens)*prefillMs)
}

// ITL predicts the per-token time at concurrency c.
func (m *SpeedModel) ITL(c int) time.Duration {
	return fromMs(m.levelValue(&m.itl, c, ms(m.prior.ITL)))
}

// Completion predicts the time a request takes end to end at concurrency c.
func (m *SpeedModel) Completion(c int, job Job) time.Duration {
	return m.TTFT(c, job.PromptTokens) + m.decode(c, job)
}

// decode predicts the time from a request's first token to its last.
func (m *SpeedModel) decode(c int, job Job) time.Duration {
	return time.Duration(max(job.OutputTokens-1, 0)) * m.ITL(c)
}

// Measured reports whether the model has learned or been seeded with anything.
func (m *SpeedModel) Measured() bool {
	for i := range m.itl {
		if m.itl[i].n > 0 {
			return true
		}
	}
	return false
}

// concurrencyExponent is how per-request time grows with concurrency where
// only one level is known: ITL(c) ≈ ITL(k)·(c/k)^0.6. It sits between vLLM's
// near-flat continuous batching and llama-server's slots (80 → 35 tok/s
// from 1 to 4 requests on an M1 Ultra in the seed is exponent 0.6), and the
// first measurement at c replaces it.
const concurrencyExponent = 0.6

// levelValue reads level c, interpolating between measured neighbours and
// extrapolating beyond them.
func (m *SpeedModel) levelValue(levels *[speedLevels]estimate, c int, prior float64) float64 {
	return m.levelValueExp(levels, c, prior, concurrencyExponent)
}

// levelValueExp is levelValue growing by exponent beyond the measured levels.
func (m *SpeedModel) levelValueExp(levels *[speedLevels]estimate, c int, prior, exponent float64) float64 {
	i := level(c)
	if levels[i].n > 0 {
		return levels[i].v
	}
	lo, hi := -1, -1
	for j := i - 1; j >= 0; j-- {
		if levels[j].n > 0 {
			lo = j
			break
		}
	}
	for j := i + 1; j < speedLevels; j++ {
		if levels[j].n > 0 {
			hi = j
			break
		}
	}
	switch {
	case lo >= 0 && hi >= 0:
		f := float64(i-lo) / float64(hi-lo)
		return levels[lo].v + f*(levels[hi].v-levels[lo].v)
	case lo >= 0:
		return levels[lo].v * math.Pow(float64(i+1)/float64(lo+1), exponent)
	case hi >= 0:
		return levels[hi].v * math.Pow(float64(i+1)/float64(hi+1), exponent)
	}
	return prior * math.Pow(float64(i+1), exponent)
}

func fromMs(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
