package store

// TEMP: stand-ins for the API that branch issue9-store adds, so that
// store/storetest and internal/partition/fake compile before it lands. Drop
// this commit (this file and the fields marked TEMP in command.go) when
// merging that branch. The ops are not implemented here: OpClaim and
// OpResetOffset fail as unknown ops (ErrBadCommand) and OpCommitOffset
// ignores Generation.

import (
	"context"
	"errors"
)

// OpClaim takes ownership of Group under a new generation; a group without
// a record starts per Command.Start. OpResetOffset sets Group's offset to
// Command.Offset under a new generation, fencing the owner.
const (
	OpClaim       Op = 10
	OpResetOffset Op = 11
)

// Start says where OpClaim starts a group that has no record.
type Start uint8

// Starts of a new group.
const (
	StartAt    Start = 0 // Command.Offset
	StartFirst Start = 1 // the log's Low
	StartLast  Start = 2 // the log's Next
)

// ErrStaleGeneration is returned by OpCommitOffset with a generation other
// than the group's; nothing changed.
var ErrStaleGeneration = errors.New("store: stale generation")

// GroupState is a group's record.
type GroupState struct {
	Offset, Generation uint64
	Updated            int64 // Now of the last change
	Reset              bool  // TEMP: the generation was taken by OpResetOffset, and no claim since
}

// Group returns group's record (stand-in: the offset only).
func (p *Partition) Group(name string) (GroupState, bool, error) {
	off, ok, err := p.GroupOffset(name)
	return GroupState{Offset: off}, ok, err
}

// Fetch is Read that waits until a message at or after from is in the log,
// ctx ends (ctx.Err()) or the partition closes (ErrClosed).
func (p *Partition) Fetch(ctx context.Context, from uint64, limit, maxBytes int, dst []Message) ([]Message, error) {
	for {
		changed := p.Changed() // before Read: no lost wake-up
		out, err := p.Read(from, limit, maxBytes, dst)
		if err != nil || len(out) > len(dst) || limit <= 0 {
			return out, err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return dst, ctx.Err()
		case <-p.stop:
			return dst, ErrClosed
		}
	}
}
