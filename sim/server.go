package sim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"fleet"
)

// Engine identities the mimics report.
const (
	llamaBuild   = 6700
	llamaCommit  = "de3ff81"
	vllmVersion  = "0.17.1"
	shutdownWait = 5 * time.Second
	// llama-server's defaults for --cache-ram (MiB) and
	// --slot-prompt-similarity.
	defaultCacheRAMMiB    = 8192
	defaultSlotSimilarity = 0.10
)

// Server is one simulated engine.
type Server struct {
	opts    Options
	log     *slog.Logger
	pool    *slotPool
	metrics *engineMetrics
	// Prompt caching: llama-server's slots and host-RAM cache, or vLLM's
	// prefix blocks; one of them is set.
	llamaCache *llamaCache
	blocks     *blockCache

	created  time.Time
	loadedAt time.Time
	// warm is closed once the first request after the load has paid the
	// cold start; coldOnce starts that.
	warm     chan struct{}
	coldOnce sync.Once
	// now is the clock; tests replace it to walk through loading.
	now func() time.Time

	idMu  sync.Mutex
	idRNG *rand.Rand

	handler http.Handler
}

// NewServer checks opts and builds the server; it does not listen.
func NewServer(opts Options) (*Server, error) {
	if opts.Mimic != fleet.EngineVLLM && opts.Mimic != fleet.EngineLlamaCpp {
		return nil, fmt.Errorf("sim: cannot mimic %q: use vllm or llamacpp", opts.Mimic)
	}
	if opts.Profile.Name == "" {
		return nil, fmt.Errorf("sim: no profile given: use one of %v", ProfileNames())
	}
	if opts.LoadTime < 0 || opts.ColdStart < 0 {
		return nil, fmt.Errorf("sim: load time %v and cold start %v must not be negative", opts.LoadTime, opts.ColdStart)
	}
	if opts.Slots < 0 || opts.Ctx < 0 || opts.TotalCtx < 0 {
		return nil, fmt.Errorf("sim: slots (%d) and context (%d) must not be negative", opts.Slots, opts.Ctx)
	}
	if opts.Slots == 0 {
		opts.Slots = opts.Profile.Slots
		if opts.Slots <= 0 {
			opts.Slots = 4
		}
	}
	switch {
	case opts.Ctx == 0 && opts.TotalCtx == 0:
		opts.Ctx, opts.TotalCtx = defaultTrainCtx, defaultTrainCtx
	case opts.Ctx == 0:
		opts.Ctx = opts.TotalCtx
	case opts.TotalCtx == 0:
		opts.TotalCtx = opts.Ctx
	}
	if opts.ModelPath == "" && len(opts.ServedNames) == 0 {
		opts.ModelPath = "Qwen3-4B-Q4_K_M.gguf"
	}
	if opts.ModelPath == "" {
		opts.ModelPath = opts.ServedNames[0]
	}
	if len(opts.ServedNames) == 0 {
		opts.ServedNames = []string{opts.ModelPath}
	}
	if opts.Mimic == fleet.EngineLlamaCpp && opts.ReasoningFormat == "" {
		opts.ReasoningFormat = ReasoningAuto
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := time.Now()
	s := &Server{
		opts:     opts,
		log:      log,
		pool:     newSlotPool(opts.Slots, opts.Ctx, sharedKV(opts)),
		metrics:  newEngineMetrics(),
		created:  now,
		loadedAt: now.Add(opts.LoadTime),
		warm:     make(chan struct{}),
		now:      time.Now,
		idRNG:    rand.New(rand.NewPCG(opts.Seed, uint64(now.UnixNano()))),
	}
	if opts.Mimic == fleet.EngineLlamaCpp {
		ram, sim := defaultCacheRAMMiB, defaultSlotSimilarity
		if opts.CacheRAMMiB != nil {
			ram = *opts.CacheRAMMiB
		}
		if opts.SlotPromptSimilarity != nil {
			sim = *opts.SlotPromptSimilarity
		}
		s.llamaCache = newLlamaCache(opts.Slots, ram, opts.Profile.KVBytesPerToken, sim, !opts.NoCacheIdleSlots, opts.KVUnified)
	} else {
		kv := max(opts.Profile.KVCacheTokens, opts.Ctx)
		s.blocks = newBlockCache(kv, !opts.NoPrefixCaching)
	}
	if opts.ColdStart == 0 {
		close(s.warm)
	}
	s.handler = s.routes()
	return s, nil
}

// warmUp holds a request until the engine is warm and returns how long it
// waited: the first request after the load starts the cold start, and every
// request that comes meanwhile waits for the same warm-up, as the first
// batch does on a real engine. A warm engine holds nothing (0).
func (s *Server) warmUp(ctx context.Context) (time.Duration, error) {
	select {
	case <-s.warm:
		return 0, nil
	default:
	}
	start := time.Now()
	s.coldOnce.Do(func() { time.AfterFunc(s.opts.ColdStart, func() { close(s.warm) }) })
	select {
	case <-s.warm:
		return time.Since(start), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// Options returns the options in effect, defaults filled in.
func (s *Server) Options() Options { return s.opts }

// Handler serves every endpoint of the mimicked engine.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) loading() bool { return s.now().Before(s.loadedAt) }

func (s *Server) newID(n int, hex bool) string {
	s.idMu.Lock()
	defer s.idMu.Unlock()
	if hex {
		return randomHex(s.idRNG, n)
	}
	return randomAlnum(s.idRNG, n)
}

func (s *Server) fingerprint() string {
	if s.opts.Mimic == fleet.EngineLlamaCpp {
		return fmt.Sprintf("b%d-%s", llamaBuild, llamaCommit)
	}
	h := seedHash(0, s.opts.ModelPath, strconv.Itoa(s.opts.Ctx))
	return fmt.Sprintf("vllm-%s-tp1-%08x", vllmVersion, uint32(h))
}

// Serve serves on ln until ctx ends, then shuts down gracefully. A vLLM
// mimic holds off serving until the model is loaded; llama-server serves at
// once and answers 503 while loading.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.opts.Mimic == fleet.EngineVLLM {
		if err := sleepCtx(ctx, time.Until(s.loadedAt)); err != nil {
			ln.Close()
			return nil
		}
	}
	baseCtx, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	readyLogged := make(chan struct{})
	go func() {
		defer close(readyLogged)
		if sleepCtx(ctx, time.Until(s.loadedAt)) == nil {
			s.log.Info("sim engine ready", "addr", ln.Addr().String(), "mimic", string(s.opts.Mimic),
				"profile", s.opts.Profile.Name, "model", s.opts.ModelID(), "slots", s.opts.Slots, "ctx", s.opts.Ctx)
		}
	}()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		<-readyLogged
		return fmt.Errorf("sim: serving on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	<-readyLogged
	s.log.Info("sim engine shutting down", "addr", ln.Addr().String())
	shutCtx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	err := srv.Shutdown(shutCtx)
	// Whatever is still streaming after the grace period is aborted, as a
	// real engine does on SIGTERM: the connections are closed before the
	// handlers are told to stop, or a handler that returns first ends its
	// stream cleanly and a proxy cannot tell it was cut.
	if err != nil {
		srv.Close()
	}
	cancelBase()
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("sim: serving on %s: %w", ln.Addr(), err)
	}
	return nil
}

// ListenAndServe listens on the configured host and port and serves until
// ctx ends. Like vLLM, a vLLM mimic only listens once its model is loaded,
// so connections are refused meanwhile.
func (s *Server) ListenAndServe(ctx context.Context) error {
	if s.opts.Mimic == fleet.EngineVLLM {
		if err := sleepCtx(ctx, time.Until(s.loadedAt)); err != nil {
			return nil
		}
	}
	addr := net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.Port))
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("sim: cannot listen on %s: %w (is another engine on that port?)", addr, err)
	}
	return s.Serve(ctx, ln)
}

// Main runs `fleet sim ARGS`: parse, listen, log one line when ready, serve
// until ctx is cancelled or SIGTERM/SIGINT arrives.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts, err := ParseArgs(args)
	if errors.Is(err, flag.ErrHelp) {
		PrintUsage(stdout)
		return nil
	}
	if err != nil {
		return err
	}
	if stderr == nil {
		stderr = io.Discard
	}
	opts.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	srv, err := NewServer(opts)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return srv.ListenAndServe(ctx)
}

// sharedKV is the KV pool all slots share: llama-server's -c under
// --kv-unified, where every slot may use all of it; 0 otherwise (vLLM
// preempts rather than fails, and a split llama-server's slots each hold
// their own part).
func sharedKV(opts Options) int {
	if opts.Mimic == fleet.EngineLlamaCpp && opts.KVUnified {
		return opts.TotalCtx
	}
	return 0
}
