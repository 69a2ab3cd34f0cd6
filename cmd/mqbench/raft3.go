package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

func init() {
	register("raft3", "raftqueue, P groups of 3 replicas on loopback TCP as raft-stock: sends of one message through its batching proposer", runRaft3)
}

// runRaft3 measures raftqueue in raft-stock's shape (openRaftGroups,
// lanRaftConfig): each send is a Group.Apply on its group's leader of an
// OpAppend of one message with a new ID (FreshID, so the dedup lookup is
// skipped), which the leader's proposer packs with the concurrent ones into
// one raft entry.
func runRaft3(ctx context.Context, b *bench) (result, error) {
	gs, err := openRaftGroups(ctx, b, func(s replicaSpec) (*raftqueue.Group, error) {
		return raftqueue.Open(raft3Config(s))
	})
	if err != nil {
		return result{}, err
	}
	elapsed, err := gs.closedLoop(ctx, b, func(ctx context.Context, g *raftqueue.Group, w int, seq int64, attempt int) error {
		now := time.Now().UnixNano()
		msg := store.Message{
			ID:        fmt.Sprintf("w%d-%d", w, seq),
			Body:      b.body,
			Timestamp: now,
			FreshID:   attempt == 0, // a retry may find its first attempt stored
		}
		_, err := g.Apply(ctx, &store.Command{Op: store.OpAppend, Now: now, Msgs: []store.Message{msg}})
		return err
	}, raft3Retry)
	if cerr := gs.close(); err == nil {
		err = cerr
	}
	return result{elapsed: elapsed, note: gs.note()}, err
}

// raft3Config is the one place that picks raft3's log store. When
// raftqueue's shared-WAL LogStore lands, set Config.LogStore here: node
// s.node's WAL (one per node, opened in runRaft3 before its replicas and
// closed after them), stream s.group. Until then each replica logs to its
// own raft-boltdb file, as in raft-stock.
func raft3Config(s replicaSpec) raftqueue.Config {
	return raftqueue.Config{ID: s.id, Dir: s.dir, Transport: s.tr, Raft: lanRaftConfig()}
}

// raft3Retry: not the leader (nothing proposed) or an unknown outcome (the
// retry, with the same ID and no FreshID, is deduplicated) send again
// through the group's leader.
func raft3Retry(err error) bool {
	return errors.Is(err, raftqueue.ErrNotLeader) || errors.Is(err, raftqueue.ErrUnknownOutcome)
}
