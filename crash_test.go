package mq_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// The crash test re-executes the test binary as a child that sends until it
// is killed. These variables select the child mode and tell it its data
// directory and cycle number.
const (
	crashDirEnv   = "ZEZE_MQ_CRASH_DIR"
	crashCycleEnv = "ZEZE_MQ_CRASH_CYCLE"
	crashTopic    = "crash"
	crashParts    = 8
	crashSenders  = 8
)

// crashAck is one message the child saw acknowledged, as it printed it:
//
//	ack <cycle> <sender> <seq> <id> <partition> <offset>
type crashAck struct {
	cycle, sender, seq int
	id                 string
	part               int
	off                int64
}

func (a crashAck) key() string  { return "k" + strconv.Itoa(a.sender) }
func (a crashAck) body() string { return fmt.Sprintf("%d/%d/%d", a.cycle, a.sender, a.seq) }

func parseAck(line string) (crashAck, bool) {
	f := strings.Fields(line)
	if len(f) != 7 || f[0] != "ack" {
		return crashAck{}, false
	}
	var a crashAck
	var err [5]error
	a.cycle, err[0] = strconv.Atoi(f[1])
	a.sender, err[1] = strconv.Atoi(f[2])
	a.seq, err[2] = strconv.Atoi(f[3])
	a.id = f[4]
	a.part, err[3] = strconv.Atoi(f[5])
	a.off, err[4] = strconv.ParseInt(f[6], 10, 64)
	return a, errors.Join(err[:]...) == nil
}

// parseBody reads back what crashAck.body wrote.
func parseBody(b []byte) (cycle, sender, seq int, ok bool) {
	f := strings.Split(string(b), "/")
	if len(f) != 3 {
		return 0, 0, 0, false
	}
	var err [3]error
	cycle, err[0] = strconv.Atoi(f[0])
	sender, err[1] = strconv.Atoi(f[1])
	seq, err[2] = strconv.Atoi(f[2])
	return cycle, sender, seq, errors.Join(err[:]...) == nil
}

// TestMQ_Crash kills a sending process with SIGKILL at random moments and
// checks after each kill, on the reopened directory, that every message whose
// send was acknowledged is stored at the partition and offset of its ack, in
// per-key send order, with a valid checksum, exactly once. The directory is
// kept across cycles, so each child appends to what the earlier ones left and
// each check covers every earlier cycle too.
func TestMQ_Crash(t *testing.T) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		cycle, _ := strconv.Atoi(os.Getenv(crashCycleEnv))
		crashChild(dir, cycle) // never returns
	}
	cycles := sized(8, 20) // 20 with ZEZE_FULL=1
	if testing.Short() {
		cycles = 5
	}
	if s := os.Getenv("ZEZE_MQ_CRASH_CYCLES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("ZEZE_MQ_CRASH_CYCLES=%q: want a positive number", s)
		}
		cycles = n
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)

	dir := t.TempDir()
	acked := map[string]crashAck{} // by ID, over all cycles
	var stored, verified int
	start := time.Now()
	for cycle := 1; cycle <= cycles; cycle++ {
		delay := time.Duration(50+rng.IntN(351)) * time.Millisecond
		got := runCrashChild(t, dir, cycle, delay)
		for _, a := range got {
			if a.cycle != cycle {
				t.Fatalf("cycle %d: child printed an ack of cycle %d", cycle, a.cycle)
			}
			if prev, ok := acked[a.id]; ok {
				t.Fatalf("cycle %d: ID %s acked twice: %+v and %+v", cycle, a.id, prev, a)
			}
			acked[a.id] = a
		}
		stored, verified = verifyCrashDir(t, dir, cycle, acked)
		t.Logf("cycle %d: killed %v after the first ack; %d acked (%d in all), %d stored", cycle, delay, len(got), len(acked), stored)
	}
	t.Logf("crash summary: %d cycles, %d acked, %d verified (%d stored, %d stored unacked), %v",
		cycles, len(acked), verified, stored, stored-len(acked), time.Since(start).Round(time.Millisecond))
}

// runCrashChild starts a child sending into dir, kills it delay after its
// first ack, and returns the acks it printed.
func runCrashChild(t testing.TB, dir string, cycle int, delay time.Duration) []crashAck {
	t.Helper()
	cmd, stdout, stderr := startChild(t, "TestMQ_Crash", crashDirEnv+"="+dir, crashCycleEnv+"="+strconv.Itoa(cycle))
	killed := false
	defer func() { // on a failed check: do not leave the child running
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	type result struct {
		acks []crashAck
		bad  []string
	}
	first := make(chan struct{})
	done := make(chan result, 1)
	go func() {
		var r result
		br := bufio.NewReader(stdout)
		for {
			line, err := br.ReadString('\n')
			if err != nil { // EOF: the child is gone; a line without '\n' was cut
				break
			}
			a, ok := parseAck(line)
			if !ok {
				r.bad = append(r.bad, line)
				continue
			}
			r.acks = append(r.acks, a)
			if len(r.acks) == 1 {
				close(first)
			}
		}
		done <- r
	}()

	select {
	case <-first:
	case r := <-done:
		cmd.Wait()
		killed = true
		t.Fatalf("cycle %d: child ended before its first ack (%v); output %q; stderr:\n%s", cycle, cmd.ProcessState, r.bad, stderr.String())
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		cmd.Wait() // before reading stderr, which Wait's copier writes
		killed = true
		t.Fatalf("cycle %d: no ack within 30s; stderr:\n%s", cycle, stderr.String())
	}
	time.Sleep(delay) // the random moment of the crash
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("kill child: %v", err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("cycle %d: child output still open 30s after SIGKILL", cycle)
	}
	cmd.Wait()
	killed = true
	if code := cmd.ProcessState.ExitCode(); code != -1 {
		t.Fatalf("cycle %d: child exited by itself with code %d before the kill; stderr:\n%s", cycle, code, stderr.String())
	}
	if len(r.bad) > 0 {
		t.Fatalf("cycle %d: child printed unexpected lines %q; stderr:\n%s", cycle, r.bad, stderr.String())
	}
	// Killed, the child never reaches the exit code by which the race
	// detector fails a test: look for its report instead.
	if strings.Contains(stderr.String(), "WARNING: DATA RACE") {
		t.Fatalf("cycle %d: data race in the child:\n%s", cycle, stderr.String())
	}
	return r.acks
}

// crashChild is the child process: it sends keyed messages from
// crashSenders goroutines, one at a time each, and prints every ack the
// moment SendMessage returns, until it is killed.
func crashChild(dir string, cycle int) {
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "crash child: "+format+"\n", args...)
		os.Exit(3)
	}
	m, err := mq.Open(dir)
	if err != nil {
		fail("open: %v", err)
	}
	ctx := context.Background()
	err = m.CreateMQ(ctx, crashTopic, crashParts, mq.Options{Type: mq.Single})
	if err != nil && !errors.Is(err, mq.ErrTopicExists) {
		fail("create: %v", err)
	}
	p, err := m.NewProducer(crashTopic)
	if err != nil {
		fail("producer: %v", err)
	}
	var out sync.Mutex // one write(2) per line, so no line is torn
	for g := 0; g < crashSenders; g++ {
		go func() {
			for seq := 0; ; seq++ {
				a := crashAck{cycle: cycle, sender: g, seq: seq}
				msg := &mq.Message{Key: a.key(), Body: []byte(a.body())}
				res, err := p.SendMessage(ctx, msg)
				if err != nil {
					fail("send %s: %v", a.body(), err)
				}
				line := fmt.Sprintf("ack %d %d %d %s %d %d\n", cycle, g, seq, msg.ID, res[0].Partition, res[0].Offset)
				out.Lock()
				_, err = os.Stdout.WriteString(line)
				out.Unlock()
				if err != nil {
					fail("stdout: %v", err)
				}
			}
		}()
	}
	// The parent kills us long before this; it only bounds an orphan's life.
	time.Sleep(2 * time.Minute)
	fail("not killed within 2 minutes")
}

// verifyCrashDir reopens dir, reads every stored message of the crash topic
// through a consumer of a new group, checks them against acked and returns
// how many messages are stored and how many acked ones were found as acked.
func verifyCrashDir(t testing.TB, dir string, cycle int, acked map[string]crashAck) (stored, verified int) {
	t.Helper()
	ctx := context.Background()
	logs := &errorLog{}
	m, err := mq.Open(dir, mq.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatalf("cycle %d: reopen: %v", cycle, err)
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Errorf("cycle %d: close: %v", cycle, err)
		}
	}()
	if n := m.Topics()[crashTopic]; n != crashParts {
		t.Fatalf("cycle %d: topic %s has %d partitions after reopen, want %d", cycle, crashTopic, n, crashParts)
	}

	// Where each partition ends: the first offset with no message. Offsets
	// are dense from 0 (no retention runs here), so a binary search finds it.
	var end [crashParts]int64
	var ackedEnd [crashParts]int64 // one past the highest acked offset
	for _, a := range acked {
		ackedEnd[a.part] = max(ackedEnd[a.part], a.off+1)
	}
	total := 0
	for p := range end {
		n, err := searchEnd(ctx, m, p)
		if err != nil {
			t.Fatalf("cycle %d: partition %d: %v", cycle, p, err)
		}
		if n < ackedEnd[p] {
			t.Fatalf("cycle %d: partition %d ends at offset %d, but offset %d was acked", cycle, p, n, ackedEnd[p]-1)
		}
		end[p] = n
		total += int(n)
	}

	// Read everything back through a consumer of a new group.
	var mu sync.Mutex
	got := make([][]*mq.Message, crashParts) // per partition, in delivery order
	n := 0
	c, err := m.NewConsumer(crashTopic, "verify-"+strconv.Itoa(cycle), mq.ListenerFunc(
		func(_ context.Context, _ string, msg *mq.Message) error {
			mu.Lock()
			got[msg.PartitionIndex] = append(got[msg.PartitionIndex], msg)
			n++
			mu.Unlock()
			return nil
		}), mq.WithStartPosition(mq.StartFirst))
	if err != nil {
		t.Fatalf("cycle %d: consumer: %v", cycle, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		have := n
		mu.Unlock()
		if have >= total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cycle %d: consumer delivered %d of %d stored messages in 30s; node errors:\n%s", cycle, have, total, logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("cycle %d: close consumer: %v", cycle, err)
	}
	if s := logs.String(); s != "" {
		t.Fatalf("cycle %d: node logged errors:\n%s", cycle, s)
	}

	// Every stored message once, at its own offset, from a known sender, and
	// each sender's messages of one cycle in send order with no gap: a sender
	// sends seq+1 only after seq was acked.
	type run struct{ cycle, sender int }
	next := map[run]int{}
	lastCycle := map[int]int{} // sender -> newest cycle seen so far along the log
	byID := map[string]*mq.Message{}
	for p, msgs := range got {
		if int64(len(msgs)) != end[p] {
			t.Fatalf("cycle %d: partition %d delivered %d messages, stores %d", cycle, p, len(msgs), end[p])
		}
		for i, msg := range msgs {
			if msg.Offset != int64(i) {
				t.Fatalf("cycle %d: partition %d: delivery %d has offset %d", cycle, p, i, msg.Offset)
			}
			if prev, ok := byID[msg.ID]; ok {
				t.Fatalf("cycle %d: ID %s stored twice: %d/%d and %d/%d", cycle, msg.ID, prev.PartitionIndex, prev.Offset, p, msg.Offset)
			}
			byID[msg.ID] = msg
			mc, ms, seq, ok := parseBody(msg.Body)
			if !ok || mc < 1 || mc > cycle || msg.Key != "k"+strconv.Itoa(ms) {
				t.Fatalf("cycle %d: %d/%d: unexpected message key %q body %q", cycle, p, msg.Offset, msg.Key, msg.Body)
			}
			if lastCycle[ms] > mc {
				t.Fatalf("cycle %d: %d/%d: key %s: cycle %d after cycle %d", cycle, p, msg.Offset, msg.Key, mc, lastCycle[ms])
			}
			lastCycle[ms] = mc
			r := run{mc, ms}
			if seq != next[r] {
				t.Fatalf("cycle %d: %d/%d: key %s of cycle %d: seq %d, want %d (order or gap)", cycle, p, msg.Offset, msg.Key, mc, seq, next[r])
			}
			next[r]++
		}
	}
	for id, a := range acked {
		msg, ok := byID[id]
		if !ok {
			t.Fatalf("cycle %d: acked message %+v is missing", cycle, a)
		}
		if msg.PartitionIndex != a.part || msg.Offset != a.off || msg.Key != a.key() || string(msg.Body) != a.body() {
			t.Fatalf("cycle %d: acked %+v (key %s body %s) but stored at %d/%d with key %s body %q",
				cycle, a, a.key(), a.body(), msg.PartitionIndex, msg.Offset, msg.Key, msg.Body)
		}
		verified++
	}
	// The same through the by-offset read path, for this cycle's acks.
	for _, a := range sortedAcks(acked, cycle) {
		msg, err := m.ReadMessage(ctx, crashTopic, a.part, a.off)
		if err != nil {
			t.Fatalf("cycle %d: ReadMessage(%d, %d): %v", cycle, a.part, a.off, err)
		}
		if msg.ID != a.id {
			t.Fatalf("cycle %d: ReadMessage(%d, %d) = ID %s, acked %s", cycle, a.part, a.off, msg.ID, a.id)
		}
	}
	return total, verified
}

// searchEnd returns the first offset of partition p without a message.
func searchEnd(ctx context.Context, m *mq.MQ, p int) (int64, error) {
	has := func(off int64) (bool, error) {
		_, err := m.ReadMessage(ctx, crashTopic, p, off)
		if errors.Is(err, mq.ErrNoMessage) {
			return false, nil
		}
		return err == nil, err
	}
	hi := int64(1)
	for {
		ok, err := has(hi - 1)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		hi *= 2
	}
	lo := hi / 2 // has(lo-1) is true (or lo == 0); has(hi-1) is false
	var ferr error
	i := sort.Search(int(hi-lo), func(i int) bool {
		ok, err := has(lo + int64(i))
		if err != nil && ferr == nil {
			ferr = err
		}
		return !ok
	})
	return lo + int64(i), ferr
}

func sortedAcks(acked map[string]crashAck, cycle int) []crashAck {
	var out []crashAck
	for _, a := range acked {
		if a.cycle == cycle {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].part != out[j].part {
			return out[i].part < out[j].part
		}
		return out[i].off < out[j].off
	})
	return out
}
