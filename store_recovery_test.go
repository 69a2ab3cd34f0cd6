package mq_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// Regression tests for the single-node store promises: an acked message is
// present at its acked offset after any crash and any reopen, whatever the
// options; damage is reported, never cut silently.

const (
	regressChildEnv = "ZEZE_MQ_REGRESS_CHILD" // scenario name
	regressDirEnv   = "ZEZE_MQ_REGRESS_DIR"
)

type regressAck struct {
	id   string
	part int
	off  int64
}

// runRegressChild runs scenario in a child process on dir and returns the
// acks it printed before it killed itself (SIGKILL: no Close, no flush).
func runRegressChild(t *testing.T, test, scenario, dir string) []regressAck {
	t.Helper()
	cmd, out, stderr := startChild(t, test, regressChildEnv+"="+scenario, regressDirEnv+"="+dir)
	var acks []regressAck
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var a regressAck
		if _, err := fmt.Sscanf(sc.Text(), "ack %s %d %d", &a.id, &a.part, &a.off); err == nil {
			acks = append(acks, a)
		}
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child %s: %v, want killed; stderr:\n%s", scenario, err, stderr.String())
	}
	if len(acks) == 0 {
		t.Fatalf("child %s acked nothing; stderr:\n%s", scenario, stderr.String())
	}
	return acks
}

// regressChild runs the scenario named by the environment, if any, and
// never returns: the process kills itself once the scenario's sends are acked.
func regressChild() {
	scenario := os.Getenv(regressChildEnv)
	if scenario == "" {
		return
	}
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "child: "+format+"\n", args...)
		os.Exit(3)
	}
	m, err := mq.Open(os.Getenv(regressDirEnv))
	if err != nil {
		fail("open: %v", err)
	}
	ctx := context.Background()
	if err := m.CreateMQ(ctx, "t", 2, mq.Options{}); err != nil && !errors.Is(err, mq.ErrTopicExists) {
		fail("create: %v", err)
	}
	p, err := m.NewProducer("t")
	if err != nil {
		fail("producer: %v", err)
	}
	var out sync.Mutex
	send := func(id string) {
		res, err := p.SendMessage(ctx, &mq.Message{ID: id, Body: []byte("body-" + id)})
		if err != nil {
			fail("send %s: %v", id, err)
		}
		out.Lock()
		fmt.Printf("ack %s %d %d\n", id, res[0].Partition, res[0].Offset)
		out.Unlock()
	}
	switch scenario {
	case "send10":
		for i := range 10 {
			send(fmt.Sprintf("m%d", i))
		}
	case "many":
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 500 {
					send(fmt.Sprintf("g%d-%d", g, i))
				}
			}()
		}
		wg.Wait()
		for part := range 2 {
			if err := m.ResetOffset(ctx, "t", "grp", mq.SeekOffset(part, 7)); err != nil {
				fail("reset: %v", err)
			}
		}
		fmt.Println("ack reset 0 7")
	default:
		fail("unknown scenario %q", scenario)
	}
	os.Stdout.Sync()
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// verifyAcked checks that every acked message is at its acked offset.
func verifyAcked(t *testing.T, m *mq.MQ, acks []regressAck) {
	t.Helper()
	for _, a := range acks {
		if a.id == "reset" {
			continue
		}
		msg, err := m.ReadMessage(context.Background(), "t", a.part, a.off)
		if err != nil {
			t.Fatalf("acked %+v: %v", a, err)
		}
		if msg.ID != a.id || string(msg.Body) != "body-"+a.id {
			t.Fatalf("acked %+v holds ID %s body %q", a, msg.ID, msg.Body)
		}
	}
}

// TestOpen_SyncIntervalAfterCrash: messages acked only in the write-ahead
// log before a crash are recovered by an Open with WithSyncInterval, their
// offsets are not reused, and a later default Open finds everything in order.
func TestOpen_SyncIntervalAfterCrash(t *testing.T) {
	regressChild()
	dir := t.TempDir()
	acks := runRegressChild(t, "TestOpen_SyncIntervalAfterCrash", "many", dir)
	m, err := mq.Open(dir, mq.WithSyncInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	verifyAcked(t, m, acks)
	next := map[int]int64{}
	for _, a := range acks {
		if a.id != "reset" {
			next[a.part] = max(next[a.part], a.off+1)
		}
	}
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		id := fmt.Sprintf("after-%d", i)
		res, err := p.SendMessage(context.Background(), &mq.Message{ID: id, Body: []byte("body-" + id)})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Offset < next[res[0].Partition] {
			t.Fatalf("send after reopen got offset %d of partition %d, acked before the crash up to %d", res[0].Offset, res[0].Partition, next[res[0].Partition]-1)
		}
		acks = append(acks, regressAck{id: id, part: res[0].Partition, off: res[0].Offset})
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = openNode(t, dir)
	verifyAcked(t, m, acks)
	// The offset reset logged before the crash is not undone: the group
	// starts at 7 in each partition.
	var fmu sync.Mutex
	first := map[int]int64{}
	c, err := m.NewConsumer("t", "grp", mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
		fmu.Lock()
		if _, ok := first[msg.PartitionIndex]; !ok {
			first[msg.PartitionIndex] = msg.Offset
		}
		fmu.Unlock()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "deliveries from both partitions", func() bool {
		fmu.Lock()
		defer fmu.Unlock()
		return len(first) == 2
	})
	c.Close()
	if first[0] != 7 || first[1] != 7 {
		t.Fatalf("group grp started at %v after reopen, reset to 7 before the crash", first)
	}
}

// TestOpen_WALDamageInMiddle: a damaged record followed by intact ones is
// corruption, not a torn tail: Open fails with ErrCorrupt instead of cutting
// acknowledged records.
func TestOpen_WALDamageInMiddle(t *testing.T) {
	regressChild()
	dir := t.TempDir()
	runRegressChild(t, "TestOpen_WALDamageInMiddle", "send10", dir)
	seg := newestSegment(t, dir)
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	b[end/2] ^= 0x40
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := mq.Open(dir)
	if err == nil {
		m.Close()
		t.Fatalf("Open after damaging byte %d of %d in %s: no error", end/2, end, seg)
	}
	if !errors.Is(err, mq.ErrCorrupt) || !strings.Contains(err.Error(), filepath.Base(seg)) {
		t.Fatalf("Open: %v, want ErrCorrupt naming %s", err, filepath.Base(seg))
	}
}

// TestOpen_EmptyOlderSegment: an empty segment that is not the newest (a
// crash while creating it, then a crash before recovery finished) holds no
// record and does not stop Open.
func TestOpen_EmptyOlderSegment(t *testing.T) {
	regressChild()
	dir := t.TempDir()
	acks := runRegressChild(t, "TestOpen_EmptyOlderSegment", "send10", dir)
	seg := newestSegment(t, dir)
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	if _, err := fmt.Sscanf(filepath.Base(seg), "%x.wal", &n); err != nil {
		t.Fatal(err)
	}
	wal := filepath.Dir(seg)
	if err := os.WriteFile(filepath.Join(wal, fmt.Sprintf("%016x.wal", n+1)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wal, fmt.Sprintf("%016x.wal", n+2)), b, 0o600); err != nil {
		t.Fatal(err)
	}
	m := openNode(t, dir)
	verifyAcked(t, m, acks)
}

func newestSegment(t *testing.T, dir string) string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no WAL segment in %s: %v", dir, err)
	}
	slices.Sort(segs)
	return segs[len(segs)-1]
}

// TestSend_ContextEndsAfterQueued: sends whose ctx ends while their command
// waits for the disk never touch another send: after reopen every acked
// offset holds its own message, no message is stored twice, and the
// partition takes new sends.
func TestSend_ContextEndsAfterQueued(t *testing.T) {
	dir := t.TempDir()
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "t", 1)
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var acks []regressAck
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				id := fmt.Sprintf("g%d-%d", g, i)
				d := time.Duration(20+(g*37+i*101)%1500) * time.Microsecond
				ctx, cancel := context.WithTimeout(context.Background(), d)
				res, err := p.SendMessage(ctx, &mq.Message{ID: id, Body: []byte("body-" + id)})
				cancel()
				if err == nil {
					mu.Lock()
					acks = append(acks, regressAck{id: id, part: 0, off: res[0].Offset})
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	m = openNode(t, dir)
	verifyAcked(t, m, acks)
	seen := map[string]int64{}
	for off := int64(0); ; off++ {
		msg, err := m.ReadMessage(context.Background(), "t", 0, off)
		if errors.Is(err, mq.ErrNoMessage) {
			break
		}
		if err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		if string(msg.Body) != "body-"+msg.ID {
			t.Fatalf("offset %d: ID %s with body %q", off, msg.ID, msg.Body)
		}
		if first, ok := seen[msg.ID]; ok {
			t.Fatalf("%s stored at %d and %d", msg.ID, first, off)
		}
		seen[msg.ID] = off
	}
	p2, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.SendMessage(context.Background(), &mq.Message{Body: []byte("after")}); err != nil {
		t.Fatalf("send after reopen: %v", err)
	}
	t.Logf("%d acked of 2400, %d stored", len(acks), len(seen))
}

// TestOpen_StallVariableIgnored: no environment variable changes what the
// store does; the name below once stalled materialization in any process.
func TestOpen_StallVariableIgnored(t *testing.T) {
	t.Setenv("ZEZE_MQ_TEST_STALL_MATERIALIZE", "1")
	m := openNode(t, "")
	mustCreate(t, m, "t", 1)
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// More commands than the old materializer queue held (16384).
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				if _, err := p.SendMessage(ctx, &mq.Message{Body: []byte("x")}); err != nil {
					t.Errorf("sender %d, send %d: %v", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestSend_TooLargeForOneRecord: one send whose messages to one partition
// would make a log record larger than recovery reads is refused before
// anything is written (it was acked, and then Open failed).
func TestSend_TooLargeForOneRecord(t *testing.T) {
	dir := t.TempDir()
	m, err := mq.Open(dir, mq.WithMaxMessageBytes(256<<20))
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "t", 1)
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 210<<20)
	msgs := make([]*mq.Message, 5)
	for i := range msgs {
		msgs[i] = &mq.Message{Body: body}
	}
	if _, err := p.SendMessage(context.Background(), msgs...); !errors.Is(err, mq.ErrMessageTooLarge) {
		t.Fatalf("5 x 210 MiB in one send: %v, want ErrMessageTooLarge", err)
	}
	if _, err := p.SendMessage(context.Background(), &mq.Message{ID: "small", Body: []byte("body-small")}); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = openNode(t, dir)
	verifyAcked(t, m, []regressAck{{id: "small", part: 0, off: 0}})
}
