package hub

import (
	"context"
	"sync"
)

// background is the work an action starts and does not wait for (a drain's
// idle watch, re-judging a model's workers after its reference moved): it
// outlives the request that started it, but not the hub. Close cancels it and
// waits, so nothing writes to the store after Close; a late event write once
// recreated fleet.db-shm in a data dir already being removed.
type background struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func newBackground() *background {
	ctx, cancel := context.WithCancel(context.Background())
	return &background{ctx: ctx, cancel: cancel}
}

// goDetached runs f with a context that keeps ctx's values, is not cancelled
// with ctx, and is cancelled when the hub closes. After Close it runs nothing.
func (b *background) goDetached(ctx context.Context, f func(ctx context.Context)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		defer context.AfterFunc(b.ctx, cancel)()
		f(ctx)
	}()
}

// close cancels the detached work and waits for it to return.
func (b *background) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}
