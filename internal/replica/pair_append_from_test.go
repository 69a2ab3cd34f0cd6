package replica

import (
	"context"
	"errors"
	"testing"

	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/raftqueue/pairlog"
)

// TestPair_AppendFromOnlyTheRecordedLeader: a replica takes appends only
// from the node the record names as the pair's leader; while this node
// leads, a caller gets the record's epoch (which tells a deposed leader
// so) and never the replica. Before, any caller got the leading node's
// replica, which takes appends whenever it does not lead yet.
func TestPair_AppendFromOnlyTheRecordedLeader(t *testing.T) {
	dir := t.TempDir()
	var ps Pairs
	cfg := PairConfig{Topic: "d", Self: "a",
		Open: func() (*raftqueue.Pair, error) {
			return raftqueue.OpenPair(raftqueue.PairConfig{Dir: dir, Partitions: 1})
		},
		SetInSync:  func(context.Context, PairRecord, []string) error { return nil },
		RenewEpoch: func(context.Context, PairRecord) error { return nil }}
	p := ps.Attach(cfg, PairRecord{Replicas: []string{"a"}, Epoch: 3, Version: 1, InSync: []string{"a"}, Alone: true})
	defer p.release()
	for _, caller := range []string{"b", "x"} {
		rep, err := p.AppendFrom(caller)
		var ee *pairlog.EpochError
		if rep != nil || !errors.As(err, &ee) || ee.Epoch != 3 {
			t.Errorf("%s appends while a leads: replica %v, %v; want epoch 3", caller, rep != nil, err)
		}
	}
	p.Update(PairRecord{Replicas: []string{"b", "a"}, Epoch: 4, Version: 2, InSync: []string{"b"}})
	if rep, err := p.AppendFrom("x"); rep != nil || !errors.Is(err, pairlog.ErrBadAppend) {
		t.Errorf("x appends while b leads: replica %v, %v; want ErrBadAppend", rep != nil, err)
	}
	if rep, err := p.AppendFrom("b"); rep == nil || err != nil {
		t.Errorf("b, the leader, appends: replica %v, %v", rep != nil, err)
	}
}
