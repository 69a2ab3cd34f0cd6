package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue/pairlog"
	"github.com/zeze-go/mq/store"
)

// TestPair_NilCommandIsError: Apply(ctx, nil) is bad input and returns
// (run in a child process, in case it crashes it). This broke as a nil
// dereference in the proposer's goroutine, which crashed the process.
func TestPair_NilCommandIsError(t *testing.T) {
	if os.Getenv("PAIR_NIL_COMMAND_CHILD") == "1" {
		ps := newPairs(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := ps.rep(0).Apply(ctx, nil)
		fmt.Printf("APPLY-RETURNED %v\n", err)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPair_NilCommandIsError$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "PAIR_NIL_COMMAND_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "APPLY-RETURNED") {
		s := string(out)
		if i := strings.Index(s, "panic:"); i >= 0 {
			s = s[i:min(len(s), i+600)]
		}
		t.Fatalf("Pair.Apply(ctx, nil) crashed the process (%v):\n%s", err, s)
	}
}

// TestPair_HostileAppendsRefused: a follower given malformed or hostile
// batches refuses them and changes nothing; a commit past the batch's end
// applies nothing past it; an undecodable entry does not kill the
// follower; a replica that leads, or is closed, refuses appends.
func TestPair_HostileAppendsRefused(t *testing.T) {
	dir := t.TempDir()
	p, err := OpenPair(PairConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, Entries: []*raft.Log{logEntry(1, 1, entryData(msg("m0")))}}); !errors.Is(err, pairlog.ErrStaleEpoch) {
		t.Fatalf("append before any epoch: %v", err)
	}
	if err := p.Follow(1); err != nil {
		t.Fatal(err)
	}
	held := func() []string {
		p.waitApplied(t)
		part, err := p.Partition(0)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := part.Read(0, 100, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ids(msgs)
	}
	if end, err := p.Append(ctx, pairlog.Append{Epoch: 1, Entries: []*raft.Log{logEntry(1, 1, entryData(msg("m0")))}}); err != nil || end != 1 {
		t.Fatalf("append 1: %d %v", end, err)
	}
	if end, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 1, PrevEpoch: 1,
		Entries: []*raft.Log{logEntry(2, 1, entryData(msg("m1")))}}); err != nil || end != 2 {
		t.Fatalf("append 2: %d %v", end, err)
	}
	// A commit far past the batch's end commits up to its end only.
	if end, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 1, PrevEpoch: 1, Commit: math.MaxUint64}); err != nil || end != 1 {
		t.Fatalf("empty append with a huge commit: %d %v", end, err)
	}
	if got := held(); !slices.Equal(got, []string{"0:m0"}) {
		t.Fatalf("after a commit capped at 1 the follower holds %v", got)
	}
	e := func(i, ep uint64) *raft.Log { return logEntry(i, ep, entryData(msg(fmt.Sprintf("h%d", i)))) }
	for _, tc := range []struct {
		name string
		a    pairlog.Append
		want error
	}{
		{"other epoch", pairlog.Append{Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Commit: 2}, pairlog.ErrStaleEpoch},
		{"epoch 0", pairlog.Append{Epoch: 0, Commit: 2}, pairlog.ErrStaleEpoch},
		{"gap", pairlog.Append{Epoch: 1, PrevIndex: 9, PrevEpoch: 1, Entries: []*raft.Log{e(10, 1)}, Commit: 10}, pairlog.ErrMismatch},
		{"prev epoch past epoch", pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 7, Commit: 2}, pairlog.ErrBadAppend},
		{"prev epoch at 0", pairlog.Append{Epoch: 1, PrevEpoch: 1, Commit: 2}, pairlog.ErrBadAppend},
		{"prev max", pairlog.Append{Epoch: 1, PrevIndex: math.MaxUint64, PrevEpoch: 1}, pairlog.ErrBadAppend},
		{"not consecutive", pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: []*raft.Log{e(3, 1), e(5, 1)}, Commit: 5}, pairlog.ErrBadAppend},
		{"nil entry", pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: []*raft.Log{nil}, Commit: 3}, pairlog.ErrBadAppend},
		{"index 0", pairlog.Append{Epoch: 1, Entries: []*raft.Log{e(0, 1)}}, pairlog.ErrBadAppend},
		{"entry epoch past append's", pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: []*raft.Log{e(3, 2)}, Commit: 3}, pairlog.ErrBadAppend},
		{"committed entry replaced", pairlog.Append{Epoch: 1, PrevIndex: 1, PrevEpoch: 0, Commit: 2}, pairlog.ErrCommitted},
	} {
		if _, err := p.Append(ctx, tc.a); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if got := held(); !slices.Equal(got, []string{"0:m0"}) {
			t.Fatalf("%s: the follower now holds %v", tc.name, got)
		}
	}
	// An undecodable entry is skipped, the follower goes on.
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1,
		Entries: []*raft.Log{logEntry(3, 1, []byte("junk"))}, Commit: 3}); err != nil {
		t.Fatalf("junk entry: %v", err)
	}
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 3, PrevEpoch: 1,
		Entries: []*raft.Log{logEntry(4, 1, entryData(msg("m2")))}, Commit: 4}); err != nil {
		t.Fatalf("after the junk entry: %v", err)
	}
	if got := held(); !slices.Equal(got, []string{"0:m0", "1:m1", "2:m2"}) {
		t.Fatalf("the follower holds %v", got)
	}
	// A leader refuses appends, even of its own epoch.
	if err := p.Lead(1, nil, false); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 4, PrevEpoch: 1,
		Entries: []*raft.Log{logEntry(5, 1, entryData(msg("intruder")))}, Commit: 5}); !errors.Is(err, pairlog.ErrStaleEpoch) {
		t.Fatalf("append to a leader: %v", err)
	}
	if res, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("m3")}}); err != nil || res.Acks[0].Offset != 3 {
		t.Fatalf("the leader's own send after the refused append: %+v %v", res, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 5, PrevEpoch: 1}); err == nil {
		t.Fatal("a closed replica took an append")
	}
}

// TestPair_BadInput: out-of-range partitions, an unknown op, an
// epoch 0, an empty Dir are errors, not panics; the pair goes on.
func TestPair_BadInput(t *testing.T) {
	if _, err := OpenPair(PairConfig{}); err == nil {
		t.Fatal("OpenPair without a Dir")
	}
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	a := ps.rep(0)
	for _, part := range []int{-1, 1, math.MaxInt} {
		if _, err := a.ApplyTo(ctx, part, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("x")}}); !errors.Is(err, store.ErrBadCommand) {
			t.Errorf("ApplyTo(%d): %v", part, err)
		}
		if _, err := a.Partition(part); !errors.Is(err, store.ErrBadCommand) {
			t.Errorf("Partition(%d): %v", part, err)
		}
	}
	if _, err := a.Apply(ctx, &store.Command{Op: 250, Now: t0}); err == nil {
		t.Error("an unknown op: nil error")
	}
	if _, err := a.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0}); err == nil {
		t.Log("an append of no message: accepted")
	}
	fresh, err := OpenPair(PairConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := fresh.Lead(0, nil, false); err == nil {
		t.Error("Lead(0) accepted")
	}
	if res, err := ps.send(ctx, 0, msg("after")); err != nil || res.Acks[0].Offset != 0 {
		t.Fatalf("a send after the bad input: %+v %v", res, err)
	}
	if got := ps.settle(); len(got) != 1 {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPair_AfterClose: every call on a closed replica returns a clear
// error.
func TestPair_AfterClose(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m")); err != nil {
		t.Fatal(err)
	}
	a := ps.rep(0)
	ps.stop(0)
	if _, err := a.Partition(0); !errors.Is(err, ErrClosed) {
		t.Errorf("Partition after Close: %v", err)
	}
	if _, err := a.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("x")}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Apply after Close: %v", err)
	}
	if err := a.Lead(5, nil, false); !errors.Is(err, ErrClosed) {
		t.Errorf("Lead after Close: %v", err)
	}
	if err := a.Follow(5); !errors.Is(err, ErrClosed) {
		t.Errorf("Follow after Close: %v", err)
	}
	if _, err := a.LeaderPartition(ctx, 0); err == nil {
		t.Errorf("LeaderPartition after Close: nil error")
	}
	if _, err := a.Append(ctx, pairlog.Append{Epoch: 1}); err == nil {
		t.Errorf("Append after Close: nil error")
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if a.Leading() || a.Epoch() != 1 {
		t.Errorf("after Close: leading %v, epoch %d", a.Leading(), a.Epoch())
	}
}

// TestPair_CtxAtWaitPoints: a cancelled ctx is honoured before the
// queue, while queued behind a full leader, and while waiting for the
// commit; each call returns promptly.
func TestPair_CtxAtWaitPoints(t *testing.T) {
	ps := newPairs(t, func(cfg *PairConfig) { cfg.MaxPending, cfg.InFlight, cfg.QueueDepth = 1, 1, 1 })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	done, dc := context.WithCancel(ctx)
	dc()
	if _, err := ps.send(done, 0, msg("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("send with a cancelled ctx: %v", err)
	}
	ps.cut[0].Store(true)
	var wg sync.WaitGroup
	start := time.Now()
	for k := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cc()
			_, err := ps.send(c, 0, msg(fmt.Sprintf("w%d", k)))
			if err == nil || !(errors.Is(err, context.DeadlineExceeded)) {
				t.Errorf("send %d with the follower cut off: %v", k, err)
			}
		}()
	}
	wg.Wait()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("sends with a 200ms ctx returned after %v", d)
	}
	c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
	err := ps.rep(0).Verify(c)
	cc()
	if !errors.Is(err, ErrNotLeader) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Verify with the follower cut off: %v", err)
	}
	ps.cut[0].Store(false)
	if _, err := ps.send(ctx, 0, msg("after")); err != nil {
		t.Fatal(err)
	}
	got := ps.settle()
	if len(got) == 0 || got[len(got)-1].ID != "after" {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPair_ReopenWithOtherOptions: both replicas reopened with another
// partition count are refused (clearly) and keep their data; reopened with
// other tuning (one command an entry, one entry pending, batches of one)
// and a new epoch, every acked message stays at its offset.
func TestPair_ReopenWithOtherOptions(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	acked := map[string]uint64{}
	sendAll := func(i int, prefix string, n int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for k := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("%s%d", prefix, k)
				res, err := ps.send(ctx, i, msg(id))
				if err != nil {
					t.Errorf("send %s: %v", id, err)
					return
				}
				mu.Lock()
				acked[id] = res.Acks[0].Offset
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	check := func(when string) {
		t.Helper()
		got := ps.settle()
		at := map[string]uint64{}
		for k, m := range got {
			if m.Offset != uint64(k) {
				t.Fatalf("%s: offset %d at position %d", when, m.Offset, k)
			}
			at[m.ID] = m.Offset
		}
		for id, off := range acked {
			if o, ok := at[id]; !ok || o != off {
				t.Fatalf("%s: %s acked at %d, held at %d (%v)", when, id, off, o, ok)
			}
		}
		if len(got) != len(acked) {
			t.Fatalf("%s: %d messages held, %d acked", when, len(got), len(acked))
		}
	}
	sendAll(0, "a", 40)
	ps.close()
	for i := range 2 {
		if p, err := OpenPair(PairConfig{Dir: ps.dirs[i], Partitions: 3}); err == nil {
			p.Close()
			t.Fatalf("%s reopened with 3 partitions", ps.id(i))
		} else if !strings.Contains(err.Error(), "partitions") {
			t.Fatalf("reopen with 3 partitions: unclear error %v", err)
		}
	}
	ps.opts = func(cfg *PairConfig) {
		cfg.MaxEntryCmds, cfg.InFlight, cfg.MaxBatch, cfg.MaxPending, cfg.QueueDepth = 1, 1, 1, 1, 1
	}
	ps.start(0)
	ps.start(1)
	ps.mu.Lock()
	ps.leader = 0
	ps.mu.Unlock()
	ps.promote(false) // b leads epoch 2
	ps.rejoin()
	if _, err := ps.rep(1).LeaderPartition(ctx, 0); err != nil {
		t.Fatal(err)
	}
	check("reopened with other tuning")
	sendAll(1, "b", 20)
	check("after sends with other tuning")
	ps.close()
	ps.opts = nil
	ps.start(0)
	ps.start(1)
	ps.promote(false) // a leads epoch 3
	ps.rejoin()
	if _, err := ps.rep(0).LeaderPartition(ctx, 0); err != nil {
		t.Fatal(err)
	}
	check("reopened with the defaults")
}
