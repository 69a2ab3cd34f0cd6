package mq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"go.uber.org/goleak"
)

// openNode opens a node in dir (a new temporary directory when dir is "")
// and closes it when the test ends.
func openNode(t testing.TB, dir string, opts ...mq.Option) *mq.MQ {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	m, err := mq.Open(dir, opts...)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

// mustCreate creates topic with n partitions.
func mustCreate(t testing.TB, m *mq.MQ, topic string, n int) {
	t.Helper()
	if err := m.CreateMQ(context.Background(), topic, n, mq.Options{Type: mq.Single}); err != nil {
		t.Fatalf("CreateMQ(%s, %d): %v", topic, n, err)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// copyTree copies src to dst, leaving runs of zeros as holes (WAL segments
// are mostly zeros allocated ahead).
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		defer out.Close()
		const blk = 64 << 10
		for off := 0; off < len(b); off += blk {
			chunk := b[off:min(off+blk, len(b))]
			if !bytes.ContainsFunc(chunk, func(r rune) bool { return r != 0 }) {
				continue
			}
			if _, err := out.WriteAt(chunk, int64(off)); err != nil {
				return err
			}
		}
		return out.Truncate(int64(len(b)))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// startChild runs the test named test again, in a child process of the
// test binary, with env added to its environment, and returns it started,
// with its standard output and the buffer its standard error goes to.
func startChild(t testing.TB, test string, env ...string) (*exec.Cmd, io.ReadCloser, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	return cmd, stdout, stderr
}

// retryClock is an mq.Clock that moves only on Advance and tells the test
// which waits were asked for, so a test can check each step of a retry
// ladder and release it without sleeping.
type retryClock struct {
	mu    sync.Mutex // guards now, seq and waits
	now   time.Time
	seq   int
	waits []retryWait
}

type retryWait struct {
	seq int
	d   time.Duration
	at  time.Time
	ch  chan time.Time
}

var _ mq.Clock = (*retryClock)(nil)

func newRetryClock() *retryClock {
	return &retryClock{now: time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *retryClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *retryClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.seq++
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waits = append(c.waits, retryWait{seq: c.seq, d: d, at: c.now.Add(d), ch: ch})
	return ch
}

// mark returns the sequence number of the latest After call.
func (c *retryClock) mark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq
}

// waitingSince reports whether a wait of exactly d was asked for after mark.
func (c *retryClock) waitingSince(mark int, d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.waits {
		if w.seq > mark && w.d == d {
			return true
		}
	}
	return false
}

// Advance moves the clock by d and fires the waits that fall due.
func (c *retryClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waits[:0]
	for _, w := range c.waits {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	c.waits = kept
}

// A public call made from inside a handler must return promptly: it works or
// fails with a clear error. These tests call it and fail, instead of hanging,
// when it has not returned after hangAfter.
const hangAfter = 10 * time.Second

// noLeaks checks, once the test's other cleanups (closing its nodes) have
// run, that no goroutine is left.
func noLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// returns waits for a value on ch, failing the test as hung after hangAfter.
func returns[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangAfter):
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		t.Fatalf("%s has not returned after %v: hung", what, hangAfter)
	}
	panic("unreachable")
}

// async runs fn in a goroutine; its result arrives on the channel.
func async(fn func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	return ch
}

// logRecords is a slog.Handler that keeps every record at Info or above.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }

func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

func (l *logRecords) WithAttrs(attrs []slog.Attr) slog.Handler { return &attrHandler{l, attrs} }

func (l *logRecords) WithGroup(string) slog.Handler { return l }

// attrHandler adds the attributes of Logger.With to each record.
type attrHandler struct {
	*logRecords
	attrs []slog.Attr
}

func (h *attrHandler) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	return h.logRecords.Handle(ctx, r)
}

func (h *attrHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &attrHandler{h.logRecords, append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

// find returns the value of attribute key in the first record whose message
// contains msg and that has the attribute, or "" and false.
func (l *logRecords) find(msg, key string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if !strings.Contains(r.Message, msg) {
			continue
		}
		val, found := "", false
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				val, found = a.Value.String(), true
				return false
			}
			return true
		})
		if found {
			return val, true
		}
	}
	return "", false
}

// stored reports whether offset is still stored in topic's partition part.
func stored(t testing.TB, m *mq.MQ, topic string, part int, offset int64) bool {
	t.Helper()
	_, err := m.ReadMessage(context.Background(), topic, part, offset)
	if errors.Is(err, mq.ErrNoMessage) {
		return false
	}
	if err != nil {
		t.Fatalf("ReadMessage(%s/%d, %d): %v", topic, part, offset, err)
	}
	return true
}

// errorLog collects the node's error-level log records: a consumer that
// cannot read (a corrupt record) says so only in the log.
type errorLog struct {
	mu   sync.Mutex
	recs []string
	errs []error // the error-valued attributes of recs
}

func (l *errorLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelError }

func (l *errorLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		if err, ok := a.Value.Any().(error); ok {
			l.mu.Lock()
			l.errs = append(l.errs, err)
			l.mu.Unlock()
		}
		return true
	})
	l.mu.Lock()
	l.recs = append(l.recs, b.String())
	l.mu.Unlock()
	return nil
}

func (l *errorLog) WithAttrs([]slog.Attr) slog.Handler { return l }

func (l *errorLog) WithGroup(string) slog.Handler { return l }

// has reports whether an error-valued attribute satisfies match.
func (l *errorLog) has(match func(error) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, err := range l.errs {
		if match(err) {
			return true
		}
	}
	return false
}

func (l *errorLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.recs, "\n")
}

func second[T any](_ T, err error) error { return err }

// lockedBuffer is a bytes buffer safe for a child's stderr copier and the
// test reading it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// fullRun reports whether the tests run at their full size
// (ZEZE_FULL=1, as CI runs them): every seed, cycle, node, message and
// trial of the exhaustive matrices, long fault schedules and soaks. By
// default they run a smaller form that still checks the same, so that
// go test ./... ends within its default timeout.
func fullRun() bool { return os.Getenv("ZEZE_FULL") == "1" }

// sized returns full under ZEZE_FULL=1 and small otherwise.
func sized[T any](small, full T) T {
	if fullRun() {
		return full
	}
	return small
}

// fullOnly skips t, a case of a matrix or a long schedule, unless the
// tests run at full size (fullRun): the default run checks the same
// promise with the matrix's other cases or a shorter schedule.
func fullOnly(t testing.TB) {
	t.Helper()
	if !fullRun() {
		t.Skip("runs with ZEZE_FULL=1 only; the default run keeps a smaller form")
	}
}

// parallelByDefault marks t, a long cluster test that spends its time
// waiting out session, election and follower timeouts, parallel with the
// others of its kind (after the sequential tests): defaultParallel at a
// time in the default run, GOMAXPROCS at a time under ZEZE_FULL=1 (CI) or
// the race detector, which slows every node tenfold, where one at a time
// left a core idle for most of the root package's half hour. Tests with
// tight bounds on wall time, fixed addresses or goroutine checks (noLeaks)
// stay sequential.
func parallelByDefault(t *testing.T) {
	t.Parallel()
}
