// Command mqbench measures the throughput and latency of Zeze MQ through its
// public API and compares the send path with a naive group commit on raw
// bbolt measured in the same run.
//
//	go run ./cmd/mqbench                      # send, ceiling, e2e; 5s each
//	go run ./cmd/mqbench -cases send -c 128 -duration 20s
//
// It prints one line per case, with msgs/s, MB/s, p50/p99 latency, and the
// process's CPU time per message, which a busy machine disturbs less than
// the rates; then the ratios send/ceiling, raft3/raft-stock, raft3/send and
// of each -tls case to its plaintext one, of the pairs that both ran, with
// their p50 and p99 ratios. Runs longer than a few seconds report progress
// on stderr every 2 seconds. On a noisy machine, -runs 5 -duration 2s
// alternates the cases and prints the median ratios.
//
// # Adding a case
//
// Write one file in this directory with the case's function and register it
// from an init function:
//
//	func init() { register("consume", "drain a filled topic with one group", runConsume) }
//
// A case gets a *bench, with its own empty directory, the flags, a meter
// and helpers, and returns a result; main runs, times and reports it. Use
// b.closedLoop for "C workers doing one operation after another", b.openMQ
// for a node in the case's directory, and b.meter to count operations and
// record latencies, which also drives the progress line.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zeze-go/mq"
)

// caseFunc runs one case until b.duration has passed or ctx ends, and
// returns what it measured.
type caseFunc func(ctx context.Context, b *bench) (result, error)

type benchCase struct {
	name, doc string
	run       caseFunc
}

// registry holds the cases in registration order; register is called from
// init functions only, so it needs no lock.
var registry []benchCase

// register adds a case named name; doc is shown by -h.
func register(name, doc string, run caseFunc) {
	for _, c := range registry {
		if c.name == name {
			panic("mqbench: case registered twice: " + name)
		}
	}
	registry = append(registry, benchCase{name: name, doc: doc, run: run})
}

func lookup(name string) (benchCase, bool) {
	for _, c := range registry {
		if c.name == name {
			return c, true
		}
	}
	return benchCase{}, false
}

// config holds the flags shared by every case.
type config struct {
	cases       string
	conc        int
	partitions  int
	size        int
	duration    time.Duration
	dir         string
	rate        int
	cpuProfile  string
	runs        int
	raftGroup   int  // partitions per raft group of the raft3 cases; 0: mq's default
	leaderOnly  bool // raft3-leader: the producers on the leading node
	doubleWrite bool // doublewrite: the raft3 case's cluster with a DoubleWrite topic
	tls         bool // the -tls cases: cluster nodes on mutual TLS, not InsecurePlaintext
}

func main() {
	var cfg config
	flag.StringVar(&cfg.cases, "cases", "send,ceiling,e2e", "comma-separated cases to run, in order")
	flag.IntVar(&cfg.conc, "c", 64, "concurrent producers")
	flag.IntVar(&cfg.partitions, "p", 8, "partitions of the benchmark topic")
	flag.IntVar(&cfg.size, "size", 1024, "message body bytes")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "how long each case runs")
	flag.StringVar(&cfg.dir, "dir", "", "directory for the data files; each case works in a new subdirectory, removed after it (default: the system's temporary directory)")
	flag.IntVar(&cfg.rate, "rate", 2000, "e2e: messages sent per second")
	flag.IntVar(&cfg.runs, "runs", 1, "run the list of cases this many times (the machine's noise shows in the spread of ratios)")
	flag.IntVar(&cfg.raftGroup, "raft-group", 0, "raft3, raft3-idle and doublewrite: partitions per raft group or pair (mq.Options.PartitionsPerRaftGroup, PartitionsPerPair; 0: the default)")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Usage = usage
	flag.Parse()
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "mqbench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintf(flag.CommandLine.Output(), "usage: mqbench [flags]\n\ncases:\n")
	for _, c := range registry {
		fmt.Fprintf(flag.CommandLine.Output(), "  %-10s %s\n", c.name, c.doc)
	}
	fmt.Fprintf(flag.CommandLine.Output(), "\nflags:\n")
	flag.PrintDefaults()
}

func run(cfg config) error {
	if cfg.conc < 1 || cfg.partitions < 1 || cfg.size < 0 || cfg.duration <= 0 || cfg.rate < 1 || cfg.runs < 1 || cfg.raftGroup < 0 {
		return fmt.Errorf("-c, -p, -duration, -rate and -runs must be positive, -size and -raft-group not negative")
	}
	var todo []benchCase
	for _, name := range strings.Split(cfg.cases, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		c, ok := lookup(name)
		if !ok {
			return fmt.Errorf("unknown case %q (run with -h for the list)", name)
		}
		todo = append(todo, c)
	}
	root := cfg.dir
	if root == "" {
		tmp, err := os.MkdirTemp("", "mqbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		root = tmp
	}
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	fmt.Printf("mqbench: c=%d p=%d size=%d duration=%v dir=%s\n", cfg.conc, cfg.partitions, cfg.size, cfg.duration, root)
	ratios := make([][]float64, len(ratioPairs))
	for range cfg.runs {
		results := map[string]result{}
		for _, c := range todo {
			res, err := runCase(ctx, cfg, root, c)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			fmt.Println(res.line(c.name))
			results[c.name] = res
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		for i, pair := range ratioPairs {
			num, den := results[pair[0]], results[pair[1]]
			if n, d := num.rate(), den.rate(); n > 0 && d > 0 {
				ratios[i] = append(ratios[i], n/d)
				fmt.Printf("ratio %s/%s: %.2f (p50 %.2f, p99 %.2f)\n", pair[0], pair[1], n/d,
					durRatio(percentile(num.lat, 0.50), percentile(den.lat, 0.50)),
					durRatio(percentile(num.lat, 0.99), percentile(den.lat, 0.99)))
			}
		}
	}
	for i, rs := range ratios {
		if len(rs) > 1 {
			slices.Sort(rs)
			fmt.Printf("ratio %s/%s over %d runs: min %.2f, median %.2f, max %.2f\n",
				ratioPairs[i][0], ratioPairs[i][1], len(rs), rs[0], rs[len(rs)/2], rs[len(rs)-1])
		}
	}
	return nil
}

// ratioPairs are the rates compared when both cases ran, numerator then
// denominator, with their latencies' p50 and p99 (a ratio above 1 is
// slower).
var ratioPairs = [][2]string{
	{"send", "ceiling"},
	{"raft3", "raft-stock"},
	{"raft3", "send"},
	{"doublewrite", "raft3"},
	{"doublewrite", "send"},
	{"remote-tls", "remote"},
	{"raft3-tls", "raft3"},
	{"doublewrite-tls", "doublewrite"},
}

// runCase runs c once in a new directory under root, removed afterwards.
func runCase(ctx context.Context, cfg config, root string, c benchCase) (result, error) {
	dir, err := os.MkdirTemp(root, c.name+"-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	b := &bench{config: cfg, name: c.name, dir: dir, body: makeBody(cfg.size)}
	return b.measure(ctx, c.run)
}

func makeBody(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}

// bench is what a case gets: the flags, its own directory and a meter.
type bench struct {
	config
	name  string
	dir   string // empty at the start, removed after the case
	body  []byte // -size bytes, shared read-only by all senders
	meter meter
	ca    *mq.ClusterCA // the -tls cases': made for the first node
}

// measure runs fn with a progress reporter and fills in the result's
// counts from the meter when fn left them empty.
func (b *bench) measure(ctx context.Context, fn caseFunc) (result, error) {
	cpu0 := cpuTime()
	start := time.Now()
	progressDone := make(chan struct{})
	var wg sync.WaitGroup
	if b.duration > 3*time.Second {
		wg.Go(func() {
			b.progress(start, progressDone)
		})
	}
	res, err := fn(ctx, b)
	close(progressDone)
	wg.Wait()
	if res.elapsed == 0 {
		res.elapsed = time.Since(start)
	}
	res.cpu = cpuTime() - cpu0
	if res.msgs == 0 {
		res.msgs = b.meter.count.Load()
		res.bytes = res.msgs * int64(b.size)
		res.lat = b.meter.latencies()
	}
	return res, err
}

// progress prints the running count every 2 seconds until done is closed.
func (b *bench) progress(start time.Time, done <-chan struct{}) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	last, lastAt := int64(0), start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			n := b.meter.count.Load()
			rate := float64(n-last) / now.Sub(lastAt).Seconds()
			fmt.Fprintf(os.Stderr, "  %s: %4.0fs  %9d msgs  %9.0f msgs/s\n", b.name, now.Sub(start).Seconds(), n, rate)
			last, lastAt = n, now
		}
	}
}

// openMQ opens a node in the case's directory with a topic "bench" of -p
// partitions.
func (b *bench) openMQ(ctx context.Context, opts ...mq.Option) (*mq.MQ, error) {
	m, err := mq.Open(filepath.Join(b.dir, "node"), opts...)
	if err != nil {
		return nil, err
	}
	if err := m.CreateMQ(ctx, "bench", b.partitions, mq.Options{Type: mq.Single}); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// closedLoop runs -c workers for -duration; each calls op(worker, seq) again
// and again and records the latency of every successful call. It returns the
// elapsed time and the first error.
func (b *bench) closedLoop(ctx context.Context, op func(ctx context.Context, worker int, seq int64) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, b.duration)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	start := time.Now()
	for w := 0; w < b.conc; w++ {
		wg.Go(func() {
			rec := b.meter.recorder()
			for seq := int64(0); ctx.Err() == nil; seq++ {
				t0 := time.Now()
				if err := op(ctx, w, seq); err != nil {
					if ctx.Err() == nil {
						errOnce.Do(func() { firstErr = err; cancel() })
					}
					return
				}
				rec.add(time.Since(t0))
			}
		})
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// meter counts operations and keeps every latency, one series per
// goroutine, so recording takes no lock.
type meter struct {
	count atomic.Int64

	mu     sync.Mutex // guards series
	series []*recorder
}

// recorder is one goroutine's latency series.
type recorder struct {
	m   *meter
	lat []time.Duration
}

func (m *meter) recorder() *recorder {
	r := &recorder{m: m, lat: make([]time.Duration, 0, 4096)}
	m.mu.Lock()
	m.series = append(m.series, r)
	m.mu.Unlock()
	return r
}

func (r *recorder) add(d time.Duration) {
	r.lat = append(r.lat, d)
	r.m.count.Add(1)
}

// latencies merges every series, sorted. Call it after the recorders stop.
func (m *meter) latencies() []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var all []time.Duration
	for _, r := range m.series {
		all = append(all, r.lat...)
	}
	slices.Sort(all)
	return all
}

// result is what a case measured. A case may leave msgs at zero to have it
// taken from the meter.
type result struct {
	msgs    int64
	bytes   int64
	elapsed time.Duration
	lat     []time.Duration // sorted
	note    string          // appended to the line
	cpu     time.Duration   // user+system CPU of the process during the case
}

func (r result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.msgs) / r.elapsed.Seconds()
}

func (r result) line(name string) string {
	s := fmt.Sprintf("%-9s %9.0f msgs/s %8.2f MB/s  p50 %8s  p99 %8s  (%d msgs in %.1fs, cpu %s/msg)",
		name, r.rate(), float64(r.bytes)/r.elapsed.Seconds()/1e6,
		fmtDur(percentile(r.lat, 0.50)), fmtDur(percentile(r.lat, 0.99)),
		r.msgs, r.elapsed.Seconds(), fmtDur(r.cpuPerMsg()))
	if r.note != "" {
		s += "  " + r.note
	}
	return s
}

func (r result) cpuPerMsg() time.Duration {
	if r.msgs == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.msgs)
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// percentile returns the q-quantile of sorted by nearest rank, 0 when empty.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	}
}
