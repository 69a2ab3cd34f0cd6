//go:build ignore

// This file documents the store API that store/storetest is written against
// and that branch issue9-store is adding. It is not compiled: delete it once
// that branch has landed. Until then the worktree of issue9-suite carries
// working stand-ins in store/zz_pending.go (commit "TEMP: store API
// stand-ins").

package store

import (
	"context"
	"errors"
)

// New ops, after OpDeleteGroup = 9.
const (
	OpClaim       Op = 10 // take ownership of Group; new generation; a group without a record starts per Command.Start
	OpResetOffset Op = 11 // set Group's offset to Command.Offset, new generation (fences the owner)
)

type Start uint8

const (
	StartAt    Start = 0 // Command.Offset
	StartFirst Start = 1 // log low
	StartLast  Start = 2 // log next
)

// Command gains:
//
//	Generation uint64 // OpCommitOffset: must equal the record's generation; a missing record accepts only 0
//	Start      Start  // OpClaim
//
// Result gains:
//
//	Offset     uint64 // OpClaim, OpResetOffset
//	Generation uint64 // OpClaim, OpResetOffset
//	Found      bool   // OpClaim: had a record
//
// Generations come from a partition-wide counter that is never reused (also
// not after OpDeleteGroup).

var ErrStaleGeneration = errors.New("store: stale generation") // OpCommitOffset with another generation; nothing changed

type GroupState struct {
	Offset, Generation uint64
	Updated            int64 // Now of the last change
}

func (p *Partition) Group(name string) (GroupState, bool, error)
func (p *Partition) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []Message) ([]Message, error)
