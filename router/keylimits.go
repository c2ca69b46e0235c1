package router

import (
	"fmt"
	"net/http"
	"time"

	"fleet"
	"fleet/router/keylimit"
)

// SetKeyLimits replaces every key's limits (keylimit.Book.Set); keys
// absent or with zero limits have none. A key keeps its spent requests and
// tokens across calls.
func (r *Router) SetKeyLimits(limits map[string]fleet.KeyLimits) { r.limits.Set(limits) }

// SeedKeyTokens sets how many tokens each key spent on the UTC day of day
// (the hub reads today's back from its store at start and on every limit
// change). The store lags by the usage not yet written, so a key keeps a
// larger count the router made that day.
func (r *Router) SeedKeyTokens(day time.Time, used map[string]int64) { r.limits.SeedTokens(day, used) }

// admitKey applies name's limits to one request to path for model (its
// metric label): it sets the rate-limit headers on w and, when a limit is
// met, returns the 429 to answer. A request that spends tokens holds
// reserve of them until it ends: the caller settles the reservation.
// Counting tokens (endpointSpec.countsTokens) is refused by the requests
// limit only.
func (r *Router) admitKey(w http.ResponseWriter, name, path, model string, reserve int64) (keylimit.Reservation, *answerError) {
	v, rv := r.limits.Admit(name, time.Now(), !endpointTable[path].countsTokens, reserve)
	for k, vs := range v.Header {
		w.Header()[k] = vs
	}
	if !v.Limited {
		return rv, nil
	}
	r.metrics.keyLimited.WithLabelValues(v.Which).Inc()
	msg := fmt.Sprintf("this API key's limit of %s requests a minute is spent; retry in %s", w.Header().Get("x-ratelimit-limit-requests"), keylimit.ResetString(v.RetryAfter))
	switch {
	case v.Hubs > 0:
		// Refused with requests of the minute left, by the leash of a
		// hub that shares the key with others (keylimit.Leash).
		msg = fmt.Sprintf("this API key's %s requests a minute are shared by the %d hubs on this database, and this hub has spent its share until they next count each other's requests; retry in %s",
			w.Header().Get("x-ratelimit-limit-requests"), v.Hubs, keylimit.ResetString(v.RetryAfter))
	case v.Which == "tokens" && v.InFlight:
		// The day is not spent: its rest is held by this key's requests
		// in flight, which give back what they do not use as they end.
		v.RetryAfter = r.opts.RetryAfter
		msg = fmt.Sprintf("this API key's limit of %s tokens a day (UTC) is reserved by its requests in flight (each holds its prompt and max_tokens until it ends); retry in a few seconds, or send a lower max_tokens", w.Header().Get("x-ratelimit-limit-tokens"))
	case v.Which == "tokens":
		msg = fmt.Sprintf("this API key's limit of %s tokens a day (UTC) is spent; it renews in %s, or ask an admin to raise it (`fleet key limit`)", w.Header().Get("x-ratelimit-limit-tokens"), keylimit.ResetString(v.RetryAfter))
	}
	return rv, &answerError{status: http.StatusTooManyRequests, model: model, typ: errTypeRateLimit, code: codeKeyRateLimit, msg: msg,
		retryAfter: max(v.RetryAfter, time.Second)}
}

// KeyBook is the book the router holds keys' limits in, for a hub that
// shares it with the other hubs on its database (keylimit.Book's Take,
// Published and Others).
func (r *Router) KeyBook() *keylimit.Book { return &r.limits }
