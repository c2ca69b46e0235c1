package router

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"fleet"
)

// keyLimits enforces each API key's optional limits: requests per minute as
// a token bucket (a full minute's worth may come at once, then one per
// 60/N s), and tokens per UTC day, refused once the day's tokens are spent
// (a request's tokens are known only after it, so the last one may cross
// the limit). State is kept only for keys that have a limit, which come
// from the key table: a client cannot grow it.
type keyLimits struct {
	mu    sync.Mutex
	state map[string]*keyState
}

type keyState struct {
	fleet.KeyLimits
	// bucket is the requests the key may still send now; at when it was.
	bucket float64
	at     time.Time
	// day is the UTC day (days since 1970) used counts the tokens of.
	day  int64
	used int64
}

func utcDay(t time.Time) int64 { return t.Unix() / 86400 }

// SetKeyLimits replaces every key's limits; keys absent or with zero
// limits have none. A key keeps its spent requests and tokens across calls.
func (r *Router) SetKeyLimits(limits map[string]fleet.KeyLimits) {
	kl := &r.limits
	kl.mu.Lock()
	defer kl.mu.Unlock()
	next := make(map[string]*keyState, len(limits))
	now := time.Now()
	for name, l := range limits {
		if l.RequestsPerMinute <= 0 && l.TokensPerDay <= 0 {
			continue
		}
		s, ok := kl.state[name]
		if !ok {
			s = &keyState{bucket: float64(l.RequestsPerMinute), at: now, day: utcDay(now)}
		}
		if l.RequestsPerMinute > 0 {
			s.bucket = min(s.bucket, float64(l.RequestsPerMinute))
		}
		s.KeyLimits = l
		next[name] = s
	}
	kl.state = next
}

// SeedKeyTokens sets how many tokens each key spent on the UTC day of day
// (the hub reads today's back from its store at start and on every limit
// change). The store lags by the usage not yet written, so a key keeps a
// larger count the router made that day.
func (r *Router) SeedKeyTokens(day time.Time, used map[string]int64) {
	kl := &r.limits
	kl.mu.Lock()
	defer kl.mu.Unlock()
	today := utcDay(day)
	for name, n := range used {
		if s, ok := kl.state[name]; ok {
			if s.day == today {
				n = max(n, s.used)
			}
			s.day, s.used = today, n
		}
	}
}

// spend counts a finished request's tokens against its key's day.
func (kl *keyLimits) spend(name string, tokens int64, at time.Time) {
	if name == "" {
		return
	}
	kl.mu.Lock()
	defer kl.mu.Unlock()
	s, ok := kl.state[name]
	if !ok || s.TokensPerDay <= 0 {
		return
	}
	if d := utcDay(at); d != s.day {
		s.day, s.used = d, 0
	}
	s.used += tokens
}

// limitVerdict is what admitting one request of a key says: the headers
// OpenAI clients read, and when refused, which limit and for how long.
type limitVerdict struct {
	limited    bool
	which      string // "requests" or "tokens"
	retryAfter time.Duration
	header     http.Header
}

// admit takes one request from name's allowance at now; tokens says the
// request spends tokens, so a spent day refuses it.
func (kl *keyLimits) admit(name string, now time.Time, tokens bool) limitVerdict {
	var v limitVerdict
	if name == "" {
		return v
	}
	kl.mu.Lock()
	defer kl.mu.Unlock()
	s, ok := kl.state[name]
	if !ok {
		return v
	}
	v.header = http.Header{}
	if rpm := s.RequestsPerMinute; rpm > 0 {
		perSec := float64(rpm) / 60
		s.bucket = min(float64(rpm), s.bucket+now.Sub(s.at).Seconds()*perSec)
		s.at = now
		if s.bucket < 1 {
			v.limited, v.which = true, "requests"
			v.retryAfter = time.Duration((1 - s.bucket) / perSec * float64(time.Second))
		}
	}
	if tpd := s.TokensPerDay; tpd > 0 {
		if d := utcDay(now); d != s.day {
			s.day, s.used = d, 0
		}
		if s.used >= tpd && !v.limited && tokens {
			v.limited, v.which = true, "tokens"
			v.retryAfter = time.Unix((s.day+1)*86400, 0).Sub(now)
		}
		v.header.Set("x-ratelimit-limit-tokens", strconv.FormatInt(tpd, 10))
		v.header.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(max(tpd-s.used, 0), 10))
		v.header.Set("x-ratelimit-reset-tokens", resetString(time.Unix((s.day+1)*86400, 0).Sub(now)))
	}
	if rpm := s.RequestsPerMinute; rpm > 0 {
		if !v.limited {
			s.bucket--
		}
		v.header.Set("x-ratelimit-limit-requests", strconv.Itoa(rpm))
		v.header.Set("x-ratelimit-remaining-requests", strconv.Itoa(int(math.Floor(max(s.bucket, 0)))))
		v.header.Set("x-ratelimit-reset-requests", resetString(time.Duration((float64(rpm)-s.bucket)/(float64(rpm)/60)*float64(time.Second))))
	}
	return v
}

// resetString spells a wait as OpenAI's x-ratelimit-reset-* headers do
// ("1s", "6m0s"), rounded up to the second.
func resetString(d time.Duration) string {
	return max(d, 0).Round(time.Second).String()
}

// admitKey applies name's limits to one request to path: it sets the
// rate-limit headers on w and, when a limit is met, answers 429 and returns
// false. Counting tokens (endpointSpec.countsTokens) is refused by the
// requests limit only.
func (r *Router) admitKey(w http.ResponseWriter, name, path string) bool {
	v := r.limits.admit(name, time.Now(), !endpointTable[path].countsTokens)
	for k, vs := range v.header {
		w.Header()[k] = vs
	}
	if !v.limited {
		return true
	}
	r.metrics.keyLimited.WithLabelValues(v.which).Inc()
	r.countStatus("", "", http.StatusTooManyRequests)
	msg := fmt.Sprintf("this API key's limit of %s requests a minute is spent; retry in %s", w.Header().Get("x-ratelimit-limit-requests"), resetString(v.retryAfter))
	if v.which == "tokens" {
		msg = fmt.Sprintf("this API key's limit of %s tokens a day (UTC) is spent; it renews in %s, or ask an admin to raise it (`fleet key limit`)", w.Header().Get("x-ratelimit-limit-tokens"), resetString(v.retryAfter))
	}
	writeError(w, http.StatusTooManyRequests, errTypeRateLimit, codeKeyRateLimit, "", msg, max(v.retryAfter, time.Second))
	return false
}
