package mq

import (
	"context"
	"sync"

	"github.com/zeze-go/mq/store"
)

// partitionLog is what producers and consumers need of one partition. The
// local implementation is *store.Partition; a partition on another node (an
// RPC client to its leader) or behind raft (a proposer that applies the same
// store commands on every replica) implements the same methods.
type partitionLog interface {
	// Apply runs one store command and returns its result once it is
	// durable. The partition no longer reads cmd when Apply returns.
	Apply(ctx context.Context, cmd *store.Command) (store.Result, error)
	Read(from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error)
	Get(offset uint64) (store.Message, bool, error)
	Stats() store.Stats
	// Changed returns a channel closed when the log or delay index grows.
	Changed() <-chan struct{}
	GroupOffset(group string) (uint64, bool, error)
	Groups() (map[string]uint64, error)
	SeekTime(t int64) (uint64, error)
	NextDue() (int64, bool, error)
	HalfTxs(fn func(store.HalfTx) bool) error
	Decision(txid string) (store.Decision, error)
	Close() error
}

var _ partitionLog = (*store.Partition)(nil)

// router resolves a topic to its partitions. localRouter serves the topics
// stored by this node; a cluster router will resolve placement through the
// metadata group and hand out remote or replicated partitions.
type router interface {
	partitions(topic string) (Options, []partitionLog, error)
}

type localRouter struct{ m *MQ }

func (r localRouter) partitions(name string) (Options, []partitionLog, error) {
	t, parts, err := r.m.topic(name)
	if err != nil {
		return Options{}, nil, err
	}
	return t.opts, parts, nil
}

// commitOffset sets group's committed offset in p, stamped by the node's
// clock.
func (m *MQ) commitOffset(ctx context.Context, p partitionLog, group string, off uint64) error {
	cmd := store.Command{Op: store.OpCommitOffset, Now: m.cfg.clock.Now().UnixNano(), Group: group, Offset: off}
	_, err := p.Apply(ctx, &cmd)
	return translate(err)
}

// forEachPart runs fn for every item, in parallel when there are several,
// and returns the first error.
func forEachPart[T any](items []T, fn func(T) error) error {
	if len(items) == 1 {
		return fn(items[0])
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, it := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(it); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}
