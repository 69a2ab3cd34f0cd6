package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

func init() {
	register("raft3-group", "raftqueue alone, P groups of 3 replicas on loopback TCP as raft-stock: sends of one message through its batching proposer", runRaft3)
	register("raft3-shared", "raft3-group with the P partitions in one group of 3 replicas (raftqueue Config.Partitions): their sends share its entries", runRaft3Shared)
}

func runRaft3(ctx context.Context, b *bench) (result, error) { return runRaft3Groups(ctx, b, false) }

func runRaft3Shared(ctx context.Context, b *bench) (result, error) {
	return runRaft3Groups(ctx, b, true)
}

// runRaft3Groups measures raftqueue in raft-stock's shape, with
// openRaftGroups and lanRaftConfig: each send is a Group.ApplyTo on its
// group's leader of an OpAppend of one message with a new ID and FreshID, so
// the dedup lookup is skipped, which the leader's proposer packs with the
// concurrent ones into one raft entry. The P partitions are P groups, or
// with shared one group.
func runRaft3Groups(ctx context.Context, b *bench, shared bool) (res result, err error) {
	var wals []*store.WAL
	defer func() {
		for _, w := range wals {
			if cerr := w.Close(); err == nil {
				err = cerr
			}
		}
	}()
	for n := range raftNodes {
		w, err := store.OpenWAL(filepath.Join(b.dir, fmt.Sprintf("n%d", n), "wal"), store.WALOptions{})
		if err != nil {
			return result{}, err
		}
		wals = append(wals, w)
	}
	groups, parts := b.partitions, 1
	if shared {
		groups, parts = 1, b.partitions
	}
	gs, err := openRaftGroups(ctx, b, groups, func(s replicaSpec) (*raftqueue.Group, error) {
		cfg, err := raft3Config(s, wals[s.node])
		if err != nil {
			return nil, err
		}
		cfg.Partitions = parts
		return raftqueue.Open(cfg)
	})
	if err != nil {
		return result{}, err
	}
	for _, w := range wals {
		if err := w.FinishRecovery(); err != nil {
			return result{}, errors.Join(err, gs.close())
		}
	}
	elapsed, err := gs.closedLoop(ctx, b, func(ctx context.Context, g *raftqueue.Group, w int, seq int64, attempt int) error {
		now := time.Now().UnixNano()
		msg := store.Message{
			ID:        fmt.Sprintf("w%d-%d", w, seq),
			Body:      b.body,
			Timestamp: now,
			FreshID:   attempt == 0, // a retry may find its first attempt stored
		}
		_, err := g.ApplyTo(ctx, benchKey(w, seq)%parts, &store.Command{Op: store.OpAppend, Now: now, Msgs: []store.Message{msg}})
		return err
	}, raft3Retry)
	if cerr := gs.close(); err == nil {
		err = cerr
	}
	return result{elapsed: elapsed, note: gs.note()}, err
}

// raft3Config is the one place that picks raft3's log store: as in a
// node, group s.group's log is a stream of its node's WAL, a
// raftqueue.WALLog, so each node makes one fdatasync for all its groups'
// appends.
func raft3Config(s replicaSpec, w *store.WAL) (raftqueue.Config, error) {
	l, err := raftqueue.OpenWALLog(w, fmt.Sprintf("g%d", s.group))
	if err != nil {
		return raftqueue.Config{}, err
	}
	return raftqueue.Config{ID: s.id, Dir: s.dir, Transport: s.tr, Raft: lanRaftConfig(), LogStore: l}, nil
}

// raft3Retry: not the leader, with nothing proposed, or an unknown outcome,
// whose retry with the same ID and no FreshID is deduplicated, send again
// through the group's leader.
func raft3Retry(err error) bool {
	return errors.Is(err, raftqueue.ErrNotLeader) || errors.Is(err, raftqueue.ErrUnknownOutcome)
}
