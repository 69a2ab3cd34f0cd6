package delivery

import (
	"context"
	"fmt"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// PosKind says what a Position names.
type PosKind int

const (
	PosFirst  PosKind = iota // the oldest stored message
	PosLast                  // the end of the partition
	PosTime                  // the first message stored at or after Time
	PosOffset                // Offset in Partition alone
)

// Position is where Reset moves a group.
type Position struct {
	Kind      PosKind
	Time      int64 // unix ns, for PosTime
	Partition int   // for PosOffset
	Offset    uint64
}

// Reset moves the committed offset of the group stored under name in
// topic's partitions to to. Each partition stores the new offset under a
// new generation with store.OpResetOffset, which fences whoever owned it: a
// worker running on this node is told at once and claims the partition
// again before it delivers anything more; its handler in progress finishes,
// and its commit is refused. Reset waits for no worker and no handler.
// Offsets are resolved in every partition first, so a bad position changes
// nothing.
func (e *Engine) Reset(ctx context.Context, topic, name string, to Position) error {
	parts, err := e.topics.Partitions(topic)
	if err != nil {
		return err
	}
	if to.Kind == PosOffset && (to.Partition < 0 || to.Partition >= len(parts)) {
		return fmt.Errorf("%w: partition %d of %s (0..%d)", ErrInvalidPartition, to.Partition, topic, len(parts)-1)
	}
	offs := map[int]uint64{}
	for i, p := range parts {
		if to.Kind == PosOffset && i != to.Partition {
			continue
		}
		off, err := target(ctx, p, to)
		if err != nil {
			return fmt.Errorf("reset %s/%d for %s: %w", topic, i, name, err)
		}
		offs[i] = off
	}
	for i, p := range parts {
		off, ok := offs[i]
		if !ok {
			continue
		}
		res, err := p.Apply(ctx, &store.Command{Op: store.OpResetOffset, Group: name, Offset: off})
		if err != nil {
			return fmt.Errorf("reset %s/%d for %s: %w", topic, i, name, err)
		}
		// The group as it is now: one created since the reset began has a
		// worker that may have claimed before the reset was stored.
		e.mu.Lock()
		g := e.groups[groupKey{topic, name}]
		e.mu.Unlock()
		if g != nil {
			g.hint(i, res.Generation)
		}
	}
	return nil
}

// target resolves to in one partition.
func target(ctx context.Context, p Partition, to Position) (uint64, error) {
	st := partition.Stats(ctx, p)
	switch to.Kind {
	case PosFirst:
		return st.Low, nil
	case PosLast:
		return st.Next, nil
	case PosTime:
		return partition.SeekTime(ctx, p, to.Time)
	}
	if to.Offset > st.Next {
		return 0, fmt.Errorf("%w: %d past the end %d", ErrInvalidOffset, to.Offset, st.Next)
	}
	return to.Offset, nil
}

// DeleteGroup removes the offsets stored under name in every partition of
// topic. It refuses with ErrGroupInUse while the group has consumers on this
// node; a consumer that joins meanwhile claims its partitions again and
// starts at its start position.
func (e *Engine) DeleteGroup(ctx context.Context, topic, name string) error {
	parts, err := e.topics.Partitions(topic)
	if err != nil {
		return err
	}
	e.mu.Lock()
	g := e.groups[groupKey{topic, name}]
	active := g != nil && len(g.members()) > 0
	e.mu.Unlock()
	if active {
		return fmt.Errorf("%w: %s of %s", ErrGroupInUse, name, topic)
	}
	for i, p := range parts {
		if _, err := p.Apply(ctx, &store.Command{Op: store.OpDeleteGroup, Group: name}); err != nil {
			return fmt.Errorf("delete %s from %s/%d: %w", name, topic, i, err)
		}
	}
	return nil
}

// Lag is one partition's backlog for a group.
type Lag struct {
	Committed uint64 // the group's offset: the next message it will get
	Next      uint64 // the partition's next offset
	Low       uint64 // the oldest message still stored
	Known     bool   // the group has an offset here; if not, Committed is Low
}

// Lags returns the backlog of the group stored under name in every
// partition of topic, or ctx's error once it ends.
func (e *Engine) Lags(ctx context.Context, topic, name string) ([]Lag, error) {
	parts, err := e.topics.Partitions(topic)
	if err != nil {
		return nil, err
	}
	out := make([]Lag, len(parts))
	for i, p := range parts {
		gs, ok, err := partition.Group(ctx, p, name)
		if err != nil {
			return nil, fmt.Errorf("%s/%d: %w", topic, i, err)
		}
		st := partition.Stats(ctx, p)
		if err := ctx.Err(); err != nil { // st may be an old answer
			return nil, err
		}
		l := Lag{Committed: max(gs.Offset, st.Low), Next: st.Next, Low: st.Low, Known: ok}
		if !ok {
			l.Committed = st.Low
		}
		out[i] = l
	}
	return out, nil
}
