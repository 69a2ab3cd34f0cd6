package txn

import (
	"testing"
	"time"
)

// fixedClock is a Clock that reads what the test sets.
type fixedClock struct{ now time.Time }

func (c *fixedClock) Now() time.Time                       { return c.now }
func (c *fixedClock) After(time.Duration) <-chan time.Time { return nil }

// TestPruneGuard_DecideTTL: what the guard lets the upkeep prune.
func TestPruneGuard_DecideTTL(t *testing.T) {
	const ttl = time.Hour
	t0 := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	later := t0.Add(5 * ttl)
	for _, c := range []struct {
		name string
		run  func(g *PruneGuard, clk *fixedClock)
		want time.Duration
	}{
		{"NotSwept", func(g *PruneGuard, clk *fixedClock) {}, 0},
		{"NoHolds", sweptEmpty, ttl},
		{"HeldFromNow", func(g *PruneGuard, clk *fixedClock) {
			sweptEmpty(g, clk)
			g.hold("tx", clk, decidedFromNow) // at t0: decisions from t0 on stay
		}, 5 * ttl},
		{"HeldAnyTime", func(g *PruneGuard, clk *fixedClock) {
			sweptEmpty(g, clk)
			g.hold("tx", clk, decidedAnyTime)
		}, 0},
		{"HeldKeepsItsAge", func(g *PruneGuard, clk *fixedClock) {
			sweptEmpty(g, clk)
			g.hold("tx", clk, decidedFromNow)
			clk.now = t0.Add(ttl)
			g.hold("tx", clk, decidedAnyTime) // the sweep finds it again
			g.hold("tx", clk, decidedFromNow)
		}, 5 * ttl},
		{"Released", func(g *PruneGuard, clk *fixedClock) {
			sweptEmpty(g, clk)
			g.hold("tx", clk, decidedAnyTime)
			g.release([]string{"tx"})
		}, ttl},
		{"SweptGone", func(g *PruneGuard, clk *fixedClock) {
			g.hold("gone", clk, decidedAnyTime)
			g.hold("listed", clk, decidedFromNow)
			tok := g.sweepStart()
			clk.now = t0.Add(ttl)
			g.hold("new", clk, decidedFromNow) // after the sweep began: not seen by it
			g.swept(tok, map[string]bool{"listed": true})
		}, 5 * ttl},
		{"SweptKeepsNewer", func(g *PruneGuard, clk *fixedClock) {
			tok := g.sweepStart()
			g.hold("new", clk, decidedAnyTime)
			g.swept(tok, nil)
		}, 0},
		{"Learned", func(g *PruneGuard, clk *fixedClock) {
			sweptEmpty(g, clk)
			g.learned()
		}, 0},
		{"LearnedDuringSweep", func(g *PruneGuard, clk *fixedClock) {
			tok := g.sweepStart()
			g.learned()
			g.swept(tok, nil)
		}, 0},
		{"LearnedThenSwept", func(g *PruneGuard, clk *fixedClock) {
			g.learned()
			sweptEmpty(g, clk)
		}, ttl},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewPruneGuard()
			clk := &fixedClock{now: t0}
			c.run(g, clk)
			if got := g.DecideTTL(later, ttl); got != c.want {
				t.Errorf("DecideTTL = %v, want %v", got, c.want)
			}
		})
	}
}

func sweptEmpty(g *PruneGuard, _ *fixedClock) { g.swept(g.sweepStart(), nil) }

// TestPruneGuard_HoldRace: a trim that computed its TTL before a hold
// spares the held transaction's decisions, which record a later time.
func TestPruneGuard_HoldRace(t *testing.T) {
	const ttl = time.Hour
	g := NewPruneGuard()
	sweptEmpty(g, nil)
	clk := &fixedClock{now: time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)}
	trimNow := clk.now
	d := g.DecideTTL(trimNow, ttl)
	decided := g.hold("tx", clk, decidedFromNow)
	if cutoff := trimNow.Add(-d); !decided.After(cutoff) && !decided.Equal(cutoff) {
		t.Errorf("decision at %v falls before the trim's cutoff %v", decided, cutoff)
	}
}
