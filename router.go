package mq

import (
	"context"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// router resolves a topic to its partitions. localRouter serves the topics
// stored by this node; a cluster router will resolve placement through the
// metadata group and hand out remote or replicated partitions.
type router interface {
	partitions(topic string) (Options, []partition.Partition, error)
}

type localRouter struct{ m *MQ }

func (r localRouter) partitions(name string) (Options, []partition.Partition, error) {
	t, err := r.m.topic(name)
	if err != nil {
		return Options{}, nil, err
	}
	return Options{Type: Type(t.Type)}, t.Parts, nil
}

// commitOffset sets group's committed offset in p, stamped by the node's
// clock.
func (m *MQ) commitOffset(ctx context.Context, p partition.Partition, group string, off uint64) error {
	cmd := store.Command{Op: store.OpCommitOffset, Now: m.cfg.clock.Now().UnixNano(), Group: group, Offset: off}
	_, err := p.Apply(ctx, &cmd)
	return translate(err)
}
