package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/zeze-go/mq/raftqueue/pairlog"
)

// promotedWithUnappliedTail leaves b leading epoch 2 with entry 5 (X) in its
// log, unapplied (a's commit never told it), and a down: b's reads wait
// for a to hold entry 5 too.
func promotedWithUnappliedTail(t *testing.T) (*pairs, *diskHooks) {
	t.Helper()
	d := &diskHooks{}
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 4 {
		if _, err := ps.send(ctx, 0, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	writeOnlyToFollower(t, ps, d, "X")
	ps.stop(0)
	ps.promote(false)
	c, cc := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cc()
	if _, err := ps.rep(1).LeaderPartition(c, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("setup: b's read with its tail unapplied: %v, want to wait", err)
	}
	return ps, d
}

// TestPair_CloseReleasesWaitingRead: every call returns once its ctx ends
// or Close is called, also a read (LeaderPartition) waiting for the new
// leader's earlier entries. This broke when neither Close nor Follow
// released that read: it returned only when its ctx ended.
func TestPair_CloseReleasesWaitingRead(t *testing.T) {
	ps, _ := promotedWithUnappliedTail(t)
	b := ps.rep(1)
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.LeaderPartition(rctx, 0)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	ps.stop(1)
	closed := time.Now()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("LeaderPartition of a closed replica returned a partition")
		}
	case <-time.After(2 * time.Second):
		rcancel()
		err := <-done
		t.Fatalf("LeaderPartition still waiting %v after Close; it returned only once its ctx was cancelled (%v)",
			time.Since(closed).Round(time.Millisecond), err)
	}
}

// TestPair_RiskStageReleasesWaitingRead: a read waiting for the promoted
// leader's earlier entries returns once the metadata moves the pair to
// the risk stage (Lead alone), which applies the entries at once. This
// broke when the reader waited on the ready channel of the earlier Lead
// and the risk stage made a new one: the reader stayed blocked until its
// ctx ended, though fresh reads succeeded.
func TestPair_RiskStageReleasesWaitingRead(t *testing.T) {
	ps, _ := promotedWithUnappliedTail(t)
	b := ps.rep(1)
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.LeaderPartition(rctx, 0)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := b.Lead(3, nil, false); err != nil { // the risk stage: b alone
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool {
		c, cc := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cc()
		_, err := b.LeaderPartition(c, 0)
		return err == nil
	}) {
		t.Fatal("b alone never became ready")
	}
	ready := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the waiting read: %v", err)
		}
	case <-time.After(2 * time.Second):
		rcancel()
		err := <-done
		t.Fatalf("a read waiting since before Lead(3, nil) is still blocked %v after the replica became ready "+
			"(fresh reads succeed); it returned only when its ctx was cancelled: %v",
			time.Since(ready).Round(time.Millisecond), err)
	}
}

// TestPair_LeadWithAllAppliedServesReads: a replica that leads with
// everything applied and a confirming follower serves reads at once, even
// after an earlier Lead whose tail was since cut while it followed. This
// broke when Lead kept the previous ready channel whenever nothing was
// left to apply, though that channel was still open: LeaderPartition
// blocked until a write happened to be applied.
func TestPair_LeadWithAllAppliedServesReads(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.cut[0].Store(true)
	c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := ps.send(c, 0, msg("orphan"))
	cc()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send cut off: %v", err)
	}
	// a leads a new epoch with entry 1 unapplied: its reads wait for it.
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew()        // the metadata gives the leader a new epoch
	ps.promote(false) // b leads epoch 2 (its log is empty)
	ps.cut[0].Store(false)
	ps.rejoin() // a follows epoch 2: b's Reset cuts a's entry 1
	if !waitFor(patience, func() bool { return ps.lastIndex(0) == 0 && ps.rep(1).Leading() }) {
		t.Fatalf("setup: a's log ends at %d", ps.lastIndex(0))
	}
	ps.promote(false) // a leads epoch 3: nothing to apply
	ps.rejoin()
	c, cc = context.WithTimeout(ctx, 2*time.Second)
	_, err = ps.rep(0).LeaderPartition(c, 0)
	cc()
	if err != nil {
		res, serr := ps.send(ctx, 0, msg("w"))
		c, cc = context.WithTimeout(ctx, 2*time.Second)
		_, err2 := ps.rep(0).LeaderPartition(c, 0)
		cc()
		t.Fatalf("leader a (epoch %d, log empty, nothing to apply, follower b confirming) refused a read for 2s: %v; "+
			"after a write (%v %v) the read gives %v", ps.rep(0).Epoch(), err, res.Acks, serr, err2)
	}
}
