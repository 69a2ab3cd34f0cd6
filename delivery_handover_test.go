package mq_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/zeze-go/mq"
)

// A reset racing a consumer's hand-over of its partition, in both orders:
// a reset stored after the closing worker committed 2 and the next owner
// delivered m2 leaves m2 before m5 (the correct outcome of a later reset);
// a reset stored before the closing handler returns makes the next owner
// start at m5. (TestMQ_ResetOffsetCloseSimultaneous therefore waits for
// ResetOffset before it opens the gate.)

// TestMQ_ResetOffsetAfterHandover: the reset applied after the gate
// opened and m2 went to the next owner, which delivers m2 before m5.
func TestMQ_ResetOffsetAfterHandover(t *testing.T) {
	m := keyedFixtureDir(t, "", 10)
	g := newGate("m1")
	a := consume(t, m, "t", "g", g)
	other := &sink{}
	b := consume(t, m, "t", "g", other)
	returns(t, g.entered, "delivery of m1")
	closed := async(a.Close)
	waitFor(t, handoverTimeout, "the partition to move", func() bool { return slices.Equal(b.Assigned(), []int{0}) })
	g.open()
	returns(t, closed, "Close")
	waitFor(t, handoverTimeout, "m2 at the next owner", func() bool { return seen(other.all(), "m2") })
	if err := m.ResetOffset(context.Background(), "t", "g", mq.SeekOffset(0, 5)); err != nil {
		t.Fatal(err)
	}
	if got := other.bodies(); got[0] != "m2" {
		t.Fatalf("next owner got %v", got)
	}
}

// TestMQ_ResetOffsetBeforeHandover is TestMQ_ResetOffsetCloseSimultaneous
// (two consumers) with the reset known to be stored before the closing
// handler returns: the next owner must start at m5, every round.
func TestMQ_ResetOffsetBeforeHandover(t *testing.T) {
	for _, kp := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeyParallel=%v", kp), func(t *testing.T) {
			m := keyedFixtureDir(t, "", 10)
			var opts []mq.ConsumerOption
			if kp {
				opts = append(opts, mq.WithKeyParallel(2))
			}
			for i := range 15 {
				group := fmt.Sprintf("g%d", i)
				g := newGate("m1")
				a := consume(t, m, "t", group, g, opts...)
				other := &sink{}
				b := consume(t, m, "t", group, other, opts...)
				returns(t, g.entered, "delivery of m1")
				start := make(chan struct{})
				closed := async(func() error { <-start; return a.Close() })
				reset := async(func() error {
					<-start
					return m.ResetOffset(context.Background(), "t", group, mq.SeekOffset(0, 5))
				})
				close(start)
				if err := returns(t, reset, "ResetOffset racing Close"); err != nil {
					t.Fatal(err)
				}
				waitFor(t, handoverTimeout, "the partition to move", func() bool { return slices.Equal(b.Assigned(), []int{0}) })
				g.open()
				if err := returns(t, closed, "Close racing ResetOffset"); err != nil {
					t.Fatal(err)
				}
				waitFor(t, handoverTimeout, "m9 at the next owner", func() bool { return seen(other.all(), "m9") })
				if got := other.bodies(); got[0] != "m5" {
					t.Fatalf("round %d: after the reset to 5 (returned before m1's handler did) the next owner got %v", i, got)
				}
				b.Close()
			}
		})
	}
}
