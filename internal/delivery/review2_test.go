package delivery

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// review2Send appends n messages; those whose index is in tagged carry tag T.
func review2Send(t *testing.T, p interface {
	Apply(context.Context, *store.Command) (store.Result, error)
}, n int, tagged map[int]bool) {
	t.Helper()
	cmd := store.Command{Op: store.OpAppend, Now: time.Now().UnixNano()}
	for i := 0; i < n; i++ {
		m := store.Message{ID: "r2-" + strconv.Itoa(i), Key: "k", Body: []byte(strconv.Itoa(i))}
		if tagged[i] {
			m.Tags = []string{"T"}
		}
		cmd.Msgs = append(cmd.Msgs, m)
	}
	if _, err := p.Apply(context.Background(), &cmd); err != nil {
		t.Fatal(err)
	}
}

// TestReview2_ResetIntoFilteredRun: a reset whose target lies inside a run
// of filtered messages redelivers the first accepted message after it, and
// nothing before; the offset ends past the log.
func TestReview2_ResetIntoFilteredRun(t *testing.T) {
	for _, kp := range []int{0, 2} {
		t.Run("KeyParallel"+strconv.Itoa(kp), func(t *testing.T) {
			tb := newTable()
			p := tb.add("orders", 1)[0]
			e := newEngine(t, tb)
			f, err := (*Filter)(nil).WithTags("T")
			if err != nil {
				t.Fatal(err)
			}
			review2Send(t, p, 10, map[int]bool{0: true, 9: true})
			cfg := testConfig()
			cfg.Filter, cfg.KeyParallel = f, kp
			l := newLog()
			c, err := e.Subscribe("orders", "billing", l.handler("c", nil), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			l.waitFor(t, 9, 10)
			waitFor(t, "offset 10", func() bool { return committed(t, p, "billing").Offset == 10 })
			if err := e.Reset(context.Background(), "orders", "billing", Position{Kind: PosOffset, Offset: 5}); err != nil {
				t.Fatal(err)
			}
			l.waitFor(t, 9, 10)
			waitFor(t, "offset 10 after the reset", func() bool { return committed(t, p, "billing").Offset == 10 })
			time.Sleep(50 * time.Millisecond)
			got := l.of("c")
			if len(got) != 3 || got[0] != 0 || got[1] != 9 || got[2] != 9 {
				t.Fatalf("deliveries %v, want [0 9 9]", got)
			}
		})
	}
}

// TestReview2_StartTimeExtremes: a start time before 1970 (clamped to
// MinInt64 by the root) starts at the first message, one after 2262
// (MaxInt64) at the end.
func TestReview2_StartTimeExtremes(t *testing.T) {
	for _, tc := range []struct {
		at   int64
		want int
	}{{math.MinInt64, 3}, {-1, 3}, {math.MaxInt64, 0}} {
		tb := newTable()
		p := tb.add("orders", 1)[0]
		e := newEngine(t, tb)
		review2Send(t, p, 3, nil)
		cfg := testConfig()
		cfg.Start, cfg.StartTime = StartTime, tc.at
		l := newLog()
		c, err := e.Subscribe("orders", "billing", l.handler("c", nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a claim", func() bool { _, ok, _ := p.Group("billing"); return ok })
		time.Sleep(100 * time.Millisecond)
		c.Close()
		if got := len(l.of("c")); got != tc.want {
			t.Errorf("start time %d: %d delivered, want %d", tc.at, got, tc.want)
		}
		gs := committed(t, p, "billing")
		if tc.want == 0 && gs.Offset != 3 {
			t.Errorf("start time %d: group at %d, want 3", tc.at, gs.Offset)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
