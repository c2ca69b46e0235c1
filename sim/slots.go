package sim

import (
	"context"
	"errors"
	"sync"
	"time"
)

// slotState is what /slots shows of one slot.
type slotState struct {
	busy         bool
	taskID       int64
	nCtx         int
	promptTokens int
	decoded      int
	remain       int
	// fail ends the request on the slot when the shared KV pool
	// overflows.
	fail context.CancelCauseFunc
}

// waiter is a queued request; ready is closed when a slot is handed to it.
type waiter struct {
	ready chan struct{}
	slot  int
}

// slotPool hands out a fixed number of slots; requests beyond them wait in
// FIFO order, as both engines' schedulers do.
type slotPool struct {
	mu    sync.Mutex
	slots []slotState
	queue []*waiter
	// kvPool is the KV tokens all busy slots share (llama-server's -c
	// under --kv-unified), 0 when each slot has its own nCtx.
	kvPool   int
	nextTask int64
}

// errKVFull is why a request ended when the slots' shared KV pool
// overflowed: llama-server then fails every request in flight at once
// (server-context.cpp, update_slots, after purging idle slots).
var errKVFull = errors.New("the shared KV pool is full")

// kvFullMessage is llama-server's own words for errKVFull.
const kvFullMessage = "Context size has been exceeded."

func newSlotPool(n, nCtx, kvPool int) *slotPool {
	p := &slotPool{slots: make([]slotState, n), kvPool: kvPool}
	for i := range p.slots {
		p.slots[i].nCtx = nCtx
		p.slots[i].taskID = -1
	}
	return p
}

// acquire waits for a free slot, FIFO, until ctx ends. A request that gives
// up while queued leaves the queue at once. choose, when set, picks among
// the idle slots (llama-server's choice by prompt similarity); a queued
// request takes the slot that frees up. fail ends the request when the
// shared KV pool overflows while it holds the slot, its own prompt's
// arrival included.
func (p *slotPool) acquire(ctx context.Context, promptTokens, remain int, choose func(idle []int) int, fail context.CancelCauseFunc) (int, error) {
	p.mu.Lock()
	if len(p.queue) == 0 {
		if i := p.freeSlotLocked(choose); i >= 0 {
			p.takeLocked(i, promptTokens, remain, fail)
			p.mu.Unlock()
			return i, nil
		}
	}
	w := &waiter{ready: make(chan struct{})}
	p.queue = append(p.queue, w)
	p.mu.Unlock()

	select {
	case <-w.ready:
		p.mu.Lock()
		p.takeLocked(w.slot, promptTokens, remain, fail)
		p.mu.Unlock()
		return w.slot, nil
	case <-ctx.Done():
		p.mu.Lock()
		defer p.mu.Unlock()
		for i, q := range p.queue {
			if q == w {
				p.queue = append(p.queue[:i], p.queue[i+1:]...)
				return -1, ctx.Err()
			}
		}
		// The slot was handed over just as we gave up: pass it on.
		p.releaseLocked(w.slot)
		return -1, ctx.Err()
	}
}

func (p *slotPool) freeSlotLocked(choose func(idle []int) int) int {
	var idle []int
	for i := range p.slots {
		if !p.slots[i].busy {
			idle = append(idle, i)
		}
	}
	switch {
	case len(idle) == 0:
		return -1
	case choose == nil:
		return idle[0]
	}
	return choose(idle)
}

func (p *slotPool) takeLocked(i, promptTokens, remain int, fail context.CancelCauseFunc) {
	p.nextTask++
	s := &p.slots[i]
	s.busy, s.taskID, s.promptTokens, s.decoded, s.remain, s.fail = true, p.nextTask, promptTokens, 0, remain, fail
	p.checkKVLocked()
}

// checkKVLocked fails every request holding a slot when the tokens the
// busy slots hold (prompt, cached part included, and decoded) overflow the
// shared pool, as llama-server does: it cannot tell which request to end,
// so it ends them all and clears their slots.
func (p *slotPool) checkKVLocked() {
	if p.kvPool <= 0 {
		return
	}
	held := 0
	for _, s := range p.slots {
		if s.busy && s.fail != nil {
			held += s.promptTokens + s.decoded
		}
	}
	if held <= p.kvPool {
		return
	}
	for i := range p.slots {
		if s := &p.slots[i]; s.busy && s.fail != nil {
			s.fail(errKVFull)
			s.fail = nil
			s.promptTokens, s.decoded = 0, 0
		}
	}
}

func (p *slotPool) release(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(i)
}

// releaseLocked frees slot i, handing it straight to the head of the queue
// so no late arrival can overtake a waiting request.
func (p *slotPool) releaseLocked(i int) {
	s := &p.slots[i]
	s.busy, s.taskID, s.decoded, s.remain, s.fail = false, -1, 0, 0, nil
	if len(p.queue) > 0 {
		w := p.queue[0]
		p.queue = p.queue[1:]
		s.busy = true // reserved until the waiter takes it
		w.slot = i
		close(w.ready)
	}
}

// generated marks slot i's request as done generating: llama-server
// releases the slot before its last chunk reaches the client, and purges
// an idle slot's cells when the pool needs them, so its tokens no longer
// count against the shared pool.
func (p *slotPool) generated(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slots[i].fail = nil
}

// progress records one decoded token on slot i.
func (p *slotPool) progress(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slots[i].decoded++
	if p.slots[i].remain > 0 {
		p.slots[i].remain--
	}
	p.checkKVLocked()
}

// busy is how many requests occupy a slot: the concurrency the speed curve
// is read at.
func (p *slotPool) busy() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.slots {
		if s.busy {
			n++
		}
	}
	return n
}

type poolStats struct {
	busy, waiting, size int
	// tokensInUse is prompt plus decoded tokens over all busy slots.
	tokensInUse int
}

func (p *slotPool) stats() poolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := poolStats{waiting: len(p.queue), size: len(p.slots)}
	for _, s := range p.slots {
		if s.busy {
			st.busy++
			st.tokensInUse += s.promptTokens + s.decoded
		}
	}
	return st
}

func (p *slotPool) snapshot() []slotState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]slotState(nil), p.slots...)
}

// pacer spaces one request's tokens by the token delay at the current
// concurrency. It schedules against deadlines rather than sleeping a fixed
// delay after each token: the simulated machine's clock does not care that
// the host running the sim is busy, so a token woken late is followed by the
// next one sooner, and the rate a client measures stays the profile's. Only
// a stall longer than maxPacerLag (a stopped process) is forgiven instead of
// caught up, so it cannot turn into a long burst.
type pacer struct {
	next time.Time
}

const maxPacerLag = time.Second

func (pc *pacer) wait(ctx context.Context, delay time.Duration) error {
	if delay <= 0 {
		return ctx.Err()
	}
	now := time.Now()
	if pc.next.IsZero() {
		pc.next = now
	}
	pc.next = pc.next.Add(delay)
	if lag := now.Sub(pc.next); lag > maxPacerLag {
		pc.next = now
		return ctx.Err()
	}
	d := time.Until(pc.next)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
