package txn

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// TestDue_CheckBackBackoff: after its k-th unanswered check, a
// transaction is checked again min(CheckAfter·2^(k-1), max(CheckAfter,
// 1 min)) later, never sooner, whatever CheckAfter (up to days) and
// however many checks are allowed: the doubling never wraps around to a
// wait that is negative or shorter.
func TestDue_CheckBackBackoff(t *testing.T) {
	for _, after := range []time.Duration{time.Millisecond, time.Second, 7 * time.Second, time.Hour, 24 * time.Hour, 90 * 24 * time.Hour} {
		for _, k := range []int{1, 2, 3, 10, 31, 32, 33, 40, 63, 64, 65, 200} {
			capped := max(after, time.Minute)
			want := capped
			if f := float64(after) * math.Pow(2, float64(k-1)); f < float64(capped) {
				want = time.Duration(f)
			}
			clock := &fixedClock{}
			n := &Node{cfg: Config{CheckAfter: after, MaxChecks: 1000, Clock: clock}}
			last := time.Unix(0, 0).Add(365 * 24 * time.Hour)
			hi := &halfInfo{firstSeen: 0, lastCheck: last.UnixNano(), maxChecks: k}
			what := fmt.Sprintf("CheckAfter %v, %d checks", after, k)
			clock.now = last.Add(want - 1)
			if n.due(hi) {
				t.Errorf("%s: due %v after the last check, want %v", what, want-1, want)
			}
			clock.now = last.Add(want)
			if !n.due(hi) {
				t.Errorf("%s: not due %v after the last check", what, want)
			}
		}
	}
}
