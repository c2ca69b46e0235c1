// Package keylimit enforces each API key's optional limits for the router:
// requests per minute and tokens per UTC day, with the tokens of requests
// in flight reserved. It knows nothing of HTTP routing: the router asks it
// to Admit a request, Settle the request's reservation when it ends, and
// Spend the tokens it used.
package keylimit

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"fleet"
)

// Book enforces each API key's optional limits: requests per minute as
// a token bucket (a full minute's worth may come at once, then one per
// 60/N s), and tokens per UTC day. A request's tokens are known only after
// it, so each one reserves what it may spend when it is admitted (reserve)
// and gives the reservation back when it ends, however it ends (Settle),
// while its real tokens are spent: a request is refused once the day's
// tokens spent and reserved reach the limit, so parallel requests cannot
// cross it by more than one request's reservation. State is kept only for
// keys that have a limit, which come from the key table: a client cannot
// grow it.
//
// Hubs that share one database hold a key's limits together: each
// publishes what it admitted and spent (Take, Published) and counts what
// the others did (Others) into its own bucket and day, so every hub's
// book follows the fleet's. What a hub admitted that the others have not
// seen yet is held to a leash (Leash) while other hubs are there, which
// bounds how far N hubs hit at once can overshoot together.
type Book struct {
	mu    sync.Mutex
	state map[string]*keyState
	// peers is how many other hubs count the same keys (0: this hub is
	// alone, and no leash holds it).
	peers int
}

// Count is what a hub admitted of one key (requests) and what they spent
// (tokens).
type Count = fleet.KeyCounts

type keyState struct {
	fleet.KeyLimits
	// bucket is the requests the key may still send now; at when it was.
	bucket float64
	at     time.Time
	// day is the UTC day (days since 1970) used counts the tokens of.
	day  int64
	used int64
	// reserved is what the key's requests in flight may still spend.
	reserved int64
	// fresh is what this hub admitted and spent since the last Take, to
	// publish; unseen is what it admitted that the other hubs may not
	// have counted yet (not taken, or taken but not published).
	fresh  Count
	unseen int64
}

// Leash is how many requests of a key limited to rpm a hub may admit that
// the other peers hubs have not counted yet, when the hub's bucket holds
// bucket requests: its share of a quarter of what is left (bucket /
// 4(peers+1)), so that hubs hit at once with a full bucket still serve
// much of it at once, and at least LeashFloor, so that a hub that serves
// a key alone keeps its pace. While each hub publishes and reads every
// sync interval, a hub's count misses at most two syncs of each other hub
// (what it has not published, and what it published since this hub last
// read); the shares then add up to no more than what is left, and N hubs
// together overshoot rpm by at most 2(N-1) floors: rpm/60, one second's
// worth, when rpm is at least 120(N-1), else 2(N-1) requests.
func Leash(rpm, peers int, bucket float64) int64 {
	if peers <= 0 {
		return math.MaxInt64
	}
	return max(LeashFloor(rpm, peers), int64(bucket/float64(4*(peers+1))))
}

// LeashFloor is the least leash of a key limited to rpm with peers other
// hubs: a 120th of rpm per other hub, at least one. The overshoot of N
// hubs is at most 2(N-1) of it.
func LeashFloor(rpm, peers int) int64 {
	return max(1, int64(rpm)/int64(120*max(peers, 1)))
}

// LeashWait is when a request refused by the leash may try again: by
// then the hub has published and read its counts several times (and a
// Retry-After is in whole seconds).
const LeashWait = time.Second

// Reservation is what one request holds of its key's day until it ends.
type Reservation struct {
	s *keyState
	n int64
}

// NoOutputBound is what a request reserves for its answer when it sets no
// max_tokens and no worker of its model says how large its context is (a
// worker's context bounds what an engine can make).
const NoOutputBound = 4096

// ReserveFor is what a request may spend: its prompt (the estimate) and
// choices answers of max_tokens each (0 choices: an endpoint that makes no
// answer, such as embeddings); without max_tokens, what the engine may make
// at most, the largest context among the model's workers less the prompt
// (NoOutputBound when no context is known). An answer never passes the
// largest context either way, and the sum saturates: a max_tokens of
// 2^63-1 reserves the whole day, it does not overflow.
func ReserveFor(promptTokens, maxTokens, choices, largestContext int) int64 {
	prompt, out := int64(promptTokens), int64(maxTokens)
	switch {
	case largestContext > 0:
		room := int64(max(largestContext-promptTokens, 0))
		if out == 0 || out > room {
			out = room
		}
	case out == 0:
		out = NoOutputBound
	}
	if choices <= 0 || out == 0 {
		return prompt
	}
	if out > (math.MaxInt64-prompt)/int64(choices) {
		return math.MaxInt64
	}
	return prompt + out*int64(choices)
}

func utcDay(t time.Time) int64 { return t.Unix() / 86400 }

// Set replaces every key's limits; keys absent or with zero limits have
// none. A key keeps its spent requests and tokens across calls.
func (kl *Book) Set(limits map[string]fleet.KeyLimits) {
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

// SeedTokens sets how many tokens each key spent on the UTC day of day.
// The store it comes from lags by the usage not yet written, so a key
// keeps a larger count made that day.
func (kl *Book) SeedTokens(day time.Time, used map[string]int64) {
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

// Spend counts a finished request's tokens against its key's day.
func (kl *Book) Spend(name string, tokens int64, at time.Time) {
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
	s.fresh.Tokens += tokens
}

// Take returns what this hub admitted and spent of each key since the
// last Take, for the other hubs to count; keys with nothing are absent.
func (kl *Book) Take() map[string]Count {
	kl.mu.Lock()
	defer kl.mu.Unlock()
	out := map[string]Count{}
	for name, s := range kl.state {
		if s.fresh != (Count{}) {
			out[name] = s.fresh
			s.fresh = Count{}
		}
	}
	return out
}

// Published says the other hubs can now read counts that Take returned:
// their requests no longer hold this hub's leash.
func (kl *Book) Published(counts map[string]Count) {
	kl.mu.Lock()
	defer kl.mu.Unlock()
	for name, c := range counts {
		if s, ok := kl.state[name]; ok {
			s.unseen = max(s.unseen-c.Requests, 0)
		}
	}
}

// Others counts what the other hubs admitted of each key (taken from its
// bucket) and spent today (at's UTC day) since the last call, and says how
// many other hubs there are; 0 (none, or none reachable) lifts the leash,
// so a hub that cannot reach the others holds each limit on its own.
func (kl *Book) Others(counts map[string]Count, peers int, at time.Time) {
	kl.mu.Lock()
	defer kl.mu.Unlock()
	kl.peers = peers
	for name, c := range counts {
		s, ok := kl.state[name]
		if !ok {
			continue
		}
		if s.RequestsPerMinute > 0 {
			s.refillLocked(at)
			s.bucket -= float64(c.Requests)
		}
		if s.TokensPerDay > 0 {
			if d := utcDay(at); d != s.day {
				s.day, s.used = d, 0
			}
			s.used += c.Tokens
		}
	}
}

// refillLocked brings the bucket to now: what it refilled since it was
// last brought, up to the whole minute. Before the others' requests come
// out of it, or a hub idle on a key would refill over them the time its
// bucket sat full and hand out a minute's worth more than the limit. A
// now before the last (a sync's time taken before a request's) changes
// nothing.
func (s *keyState) refillLocked(now time.Time) {
	if !now.After(s.at) {
		return
	}
	rpm := float64(s.RequestsPerMinute)
	s.bucket = min(rpm, s.bucket+now.Sub(s.at).Seconds()*rpm/60)
	s.at = now
}

// Verdict is what admitting one request of a key says: the headers
// OpenAI clients read, and when refused, which limit and for how long.
type Verdict struct {
	Limited    bool
	Which      string // "requests" or "tokens"
	RetryAfter time.Duration
	// InFlight says the tokens refused are not spent but reserved by the
	// key's requests in flight: they come back as those end.
	InFlight bool
	// Hubs is, for a refusal by the leash, how many hubs share the key's
	// limit, this one included; 0 otherwise.
	Hubs   int
	Header http.Header
}

// judgeTokensLocked judges a request of s against the day's tokens at now
// (refusing it, when tokens says it spends some, once what is spent and
// reserved reaches the limit) and sets the token headers.
func (s *keyState) judgeTokensLocked(v *Verdict, now time.Time, tokens bool) {
	tpd := s.TokensPerDay
	if d := utcDay(now); d != s.day {
		s.day, s.used = d, 0
	}
	reset := time.Unix((s.day+1)*86400, 0).Sub(now)
	if s.used+s.reserved >= tpd && !v.Limited && tokens {
		v.Limited, v.Which, v.RetryAfter = true, "tokens", reset
		v.InFlight = s.used < tpd
	}
	v.Header.Set("x-ratelimit-limit-tokens", strconv.FormatInt(tpd, 10))
	v.Header.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(max(tpd-s.used-s.reserved, 0), 10))
	v.Header.Set("x-ratelimit-reset-tokens", ResetString(reset))
}

// Settle gives a request's reservation back; what it really spent was
// counted by Spend.
func (kl *Book) Settle(rv Reservation) {
	if rv.s == nil {
		return
	}
	kl.mu.Lock()
	defer kl.mu.Unlock()
	rv.s.reserved -= rv.n
}

// Admit takes one request from name's allowance at now. spends says the
// request spends tokens, so it is judged against the day's tokens and, when
// admitted, reserves n of them until it ends (Settle); a reservation of more
// than the whole day holds the whole day.
func (kl *Book) Admit(name string, now time.Time, spends bool, n int64) (Verdict, Reservation) {
	var v Verdict
	var rv Reservation
	if name == "" {
		return v, rv
	}
	kl.mu.Lock()
	defer kl.mu.Unlock()
	s, ok := kl.state[name]
	if !ok {
		return v, rv
	}
	v.Header = http.Header{}
	if rpm := s.RequestsPerMinute; rpm > 0 {
		perSec := float64(rpm) / 60
		s.refillLocked(now)
		switch {
		case s.bucket < 1:
			v.Limited, v.Which = true, "requests"
			v.RetryAfter = time.Duration((1 - s.bucket) / perSec * float64(time.Second))
		case s.unseen >= Leash(rpm, kl.peers, s.bucket):
			// Not spent, as far as this hub knows; but it has admitted
			// its share of what the other hubs cannot see yet.
			v.Limited, v.Which, v.RetryAfter = true, "requests", LeashWait
			v.Hubs = kl.peers + 1
		}
	}
	if s.TokensPerDay > 0 {
		s.judgeTokensLocked(&v, now, spends)
		if !v.Limited && spends {
			rv = Reservation{s: s, n: min(max(n, 0), s.TokensPerDay)}
			s.reserved += rv.n
		}
	}
	if !v.Limited {
		s.fresh.Requests++
		s.unseen++
	}
	if rpm := s.RequestsPerMinute; rpm > 0 {
		if !v.Limited {
			s.bucket--
		}
		v.Header.Set("x-ratelimit-limit-requests", strconv.Itoa(rpm))
		v.Header.Set("x-ratelimit-remaining-requests", strconv.Itoa(int(math.Floor(max(s.bucket, 0)))))
		v.Header.Set("x-ratelimit-reset-requests", ResetString(time.Duration((float64(rpm)-s.bucket)/(float64(rpm)/60)*float64(time.Second))))
	}
	return v, rv
}

// ResetString spells a wait as OpenAI's x-ratelimit-reset-* headers do
// ("1s", "6m0s"), rounded up to the second.
func ResetString(d time.Duration) string {
	return max(d, 0).Round(time.Second).String()
}
