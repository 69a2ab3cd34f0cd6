package node

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/wire"
)

// TestPlanLeaders_Cases: six groups led by one of three nodes spread two
// each; a group whose only eligible replica leads stays; a balanced
// cluster moves nothing; a group without a known leader stays.
func TestPlanLeaders_Cases(t *testing.T) {
	all := []string{"n1", "n2", "n3"}
	g := func(i int) groupRef { return groupRef{Topic: "t", First: i} }
	eligible := map[groupRef][]string{}
	leaders := map[groupRef]string{}
	for i := range 6 {
		eligible[g(i)], leaders[g(i)] = all, "n1"
	}
	plan := planLeaders(eligible, leaders)
	after := apply(leaders, plan)
	if counts := countLeaders(after); len(plan) != 4 || counts["n1"] != 2 || counts["n2"] != 2 || counts["n3"] != 2 {
		t.Fatalf("plan %v leaves %v", plan, counts)
	}
	for _, tr := range plan {
		if tr.from != "n1" {
			t.Errorf("%v does not move from the group's leader", tr)
		}
	}

	eligible[g(0)] = []string{"n1"} // n2 and n3 down or lost for group 0
	if plan := planLeaders(eligible, leaders); countLeaders(apply(leaders, plan))["n1"] < 2 || slices.ContainsFunc(plan, func(tr transfer) bool { return tr.group == g(0) }) {
		t.Errorf("plan %v moves group 0, which only n1 may lead", plan)
	}

	if plan := planLeaders(eligible, after); len(plan) != 0 {
		t.Errorf("a balanced cluster's plan: %v", plan)
	}

	unknown := map[groupRef]string{g(1): "n1", g(2): "n1", g(3): "n1"}
	for _, tr := range planLeaders(eligible, unknown) {
		if _, ok := unknown[tr.group]; !ok {
			t.Errorf("%v moves a group without a known leader", tr)
		}
	}
}

// TestPlanLeaders_Random: for random placements and leaders, the plan
// moves each group at most once, from its leader to one of its eligible
// replicas, and leaves no group whose leader leads two more than one of
// its eligible replicas.
func TestPlanLeaders_Random(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 2000 {
		nodes := 1 + r.IntN(7)
		eligible := map[groupRef][]string{}
		leaders := map[groupRef]string{}
		for i := range r.IntN(40) {
			var reps []string
			for _, j := range r.Perm(nodes)[:min(nodes, 1+r.IntN(3))] {
				reps = append(reps, fmt.Sprintf("n%d", j))
			}
			eligible[groupRef{Topic: "t", First: i}] = reps
			if r.IntN(10) > 0 {
				leaders[groupRef{Topic: "t", First: i}] = reps[r.IntN(len(reps))]
			}
		}
		plan := planLeaders(eligible, leaders)
		seen := map[groupRef]bool{}
		for _, tr := range plan {
			if seen[tr.group] || tr.from != leaders[tr.group] || !slices.Contains(eligible[tr.group], tr.to) || tr.to == tr.from {
				t.Fatalf("round %d: bad transfer %v in %v", round, tr, plan)
			}
			seen[tr.group] = true
		}
		after := apply(leaders, plan)
		counts := countLeaders(after)
		for g, l := range after {
			for _, id := range eligible[g] {
				if counts[l]-counts[id] >= 2 {
					t.Fatalf("round %d: %s leads %d, %s (a replica of %v) %d, after %v", round, l, counts[l], id, g, counts[id], plan)
				}
			}
		}
	}
}

// TestBalanceMessages_HostileInput: an OpLeading reply and an OpLeadTo
// request over the limits, or malformed, are refused before they are
// decoded.
func TestBalanceMessages_HostileInput(t *testing.T) {
	big := leadingReply{Groups: make([]groupRef, 1<<16+1)}
	b, err := msgpack.Marshal(&big)
	if err != nil {
		t.Fatal(err)
	}
	var r leadingReply
	if err := wire.UnmarshalLimited(b, &r, balanceLimits); err == nil {
		t.Fatal("a reply of 65537 groups decoded")
	}
	long, _ := msgpack.Marshal(&leadTo{Group: groupRef{Topic: string(make([]byte, 256))}, To: "n2"})
	var lt leadTo
	for i, b := range [][]byte{nil, {0xc1}, {0x92, 0x92}, long, {0xdd, 0xff, 0xff, 0xff, 0xff}} {
		if err := wire.UnmarshalLimited(b, &lt, balanceLimits); err == nil {
			t.Errorf("case %d decoded: %+v", i, lt)
		}
	}
}

func apply(leaders map[groupRef]string, plan []transfer) map[groupRef]string {
	out := maps.Clone(leaders)
	for _, tr := range plan {
		out[tr.group] = tr.to
	}
	return out
}

func countLeaders(leaders map[groupRef]string) map[string]int {
	out := map[string]int{}
	for _, l := range leaders {
		out[l]++
	}
	return out
}
