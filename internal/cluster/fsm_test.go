package cluster

import (
	"bytes"
	"io"
	"testing"

	"github.com/zeze-go/mq/internal/metastate"
)

// TestFSM_Restore: a snapshot restored through the fsm, as raft restores
// it, is the state that was saved, and wakes the watchers of the state it
// replaces.
func TestFSM_Restore(t *testing.T) {
	s := metastate.New()
	for i, c := range []metastate.Command{
		metastate.RegisterNode{ID: "a", Addr: "a:7000"}, metastate.RegisterNode{ID: "b", Addr: "b:7000"},
		metastate.CreateTopic{Name: "t", Partitions: 3, Type: metastate.TypeSingle},
		metastate.CreateTopic{Name: "d", Partitions: 2, Type: metastate.TypeDoubleWrite},
		metastate.JoinGroup{Topic: "t", Group: "g", Member: "m", Node: "a"},
	} {
		next, _, err := s.Apply(uint64(i+1), c)
		if err != nil {
			t.Fatalf("%T: %v", c, err)
		}
		s = next
	}
	b, err := metastate.EncodeSnapshot(s)
	if err != nil {
		t.Fatal(err)
	}
	f := newFSM(discardLogger())
	old := f.state().Changed()
	if err := f.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-old:
	default:
		t.Fatal("Restore did not signal watchers")
	}
	got, err := metastate.EncodeSnapshot(f.state())
	if err != nil || !bytes.Equal(got, b) || f.state().Index() != s.Index() {
		t.Fatalf("the restored state differs (%v)", err)
	}
}
