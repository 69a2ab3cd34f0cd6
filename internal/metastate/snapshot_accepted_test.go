package metastate

import (
	"testing"
)

// TestSnapshot_RefusesAcceptedWithBothReplicasInSync: Apply never
// keeps Partition.Accepted once both replicas are in sync (SetInSync with
// two clears it; AcceptLoss, Promote, lostCopies and a move leave one or
// none in sync), and a snapshot is ErrCorrupt rather than a state Apply
// could not reach.
func TestSnapshot_RefusesAcceptedWithBothReplicasInSync(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite})
	b := encodeSnap(t, ft.s())
	corruptSnapshot(t, b, func(v *snapV7) {
		p := &v.Topics[0].Parts[0]
		if len(p.InSync) != 2 {
			t.Fatalf("fixture: in sync %q, want both replicas", p.InSync)
		}
		p.Epoch, p.Accepted = 2, 2
	})
}
