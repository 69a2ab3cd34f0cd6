package remote

import (
	"context"
	"errors"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/store"
)

// ServePartitions registers the partition service's ops on s: each request
// names a topic and an index, which lookup turns into the partition that
// answers it. lookup's error is the reply's: register its sentinels with
// RegisterError. A served partition's Apply gets the command as the
// caller sent it: a partition.Local stamps a zero Now with this node's
// clock, this node being the proposer.
//
// authorize, unless nil, is asked first whether peer may make the request:
// op on partition index of topic, with the command for OpApply, its
// messages not yet decoded, and nil for the others; its error is the
// call's.
func ServePartitions(s *Server, lookup func(topic string, index int) (partition.Partition, error),
	authorize func(peer, topic string, index int, op uint16, cmd *store.Command) error) {
	sv := &service{lookup: lookup, authorize: authorize, budget: s.MaxFrameBytes() - wire.FrameHeaderSize - replyReserve}
	for op := OpApply; op <= lastPartOp; op++ {
		s.Handle(op, func(ctx context.Context, peer string, req []byte) ([]byte, error) {
			return sv.serve(ctx, peer, op, req)
		})
	}
}

type service struct {
	lookup    func(topic string, index int) (partition.Partition, error)
	authorize func(peer, topic string, index int, op uint16, cmd *store.Command) error
	budget    int // the bytes a reply's payload may take
}

// serve answers a request of op: its head decoded, authorized, and only
// then its body (an Apply's messages) decoded, so that a caller without
// the right costs the decoding of a head.
func (sv *service) serve(ctx context.Context, peer string, op uint16, b []byte) ([]byte, error) {
	r, err := decodeRequestHead(op, b)
	if err != nil {
		return nil, err
	}
	if sv.authorize != nil {
		var cmd *store.Command
		if op == OpApply {
			cmd = r.cmd
		}
		if err := sv.authorize(peer, r.topic, r.index, op, cmd); err != nil {
			return nil, err
		}
	}
	if err := r.decodeBody(); err != nil {
		return nil, err
	}
	p, err := sv.lookup(r.topic, r.index)
	if err != nil {
		return nil, err
	}
	a, err := sv.run(ctx, op, p, r)
	if err != nil {
		return nil, err
	}
	out, _, err := appendReply(nil, op, a, sv.budget)
	return out, err
}

// run runs request r of op on p. An error is the call's; errors that come
// with a result travel in the reply.
func (sv *service) run(ctx context.Context, op uint16, p partition.Partition, r *partReq) (*partResp, error) {
	a := &partResp{}
	var err error
	switch op {
	case OpApply:
		// The store returns a result with some errors: with ErrDecided it
		// names the decision that refused the command, with
		// ErrStaleGeneration the record. The reply carries both.
		a.res, a.err = p.Apply(ctx, r.cmd)
		a.stats = p.Stats()
	case OpFetch:
		a.msgs, err = sv.fetch(ctx, p, r)
		a.stats = p.Stats()
	case OpGet:
		var m store.Message
		if m, a.ok, err = p.Get(r.offset); a.ok {
			a.msgs = []store.Message{m}
		}
	case OpStats:
		a.stats = p.Stats()
	case OpGroup:
		a.group, a.ok, err = p.Group(r.name)
	case OpGroupStates:
		a.groups, a.err = p.GroupStates()
	case OpSeekTime:
		a.offset, err = p.SeekTime(r.t)
	case OpNextDue:
		a.due, a.ok, err = p.NextDue()
	case OpHalfTxs:
		a.halves, a.more, err = sv.halfTxs(p, r)
	case OpDecision:
		a.decision, err = p.Decision(r.name)
	}
	return a, err
}

// fetch is one long poll: Fetch bounded by the wait asked for, an empty
// batch when it passes, and at most what a reply holds.
func (sv *service) fetch(ctx context.Context, p partition.Partition, r *partReq) ([]store.Message, error) {
	wait := time.Duration(min(r.waitMS, uint64(maxFetchWait/time.Millisecond))) * time.Millisecond
	max, maxBytes := min(r.max, sv.budget/minMessageBytes), r.maxBytes
	if maxBytes <= 0 || maxBytes > sv.budget {
		maxBytes = sv.budget
	}
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	msgs, err := p.Fetch(fctx, r.from, max, maxBytes, nil)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && fctx.Err() != nil && ctx.Err() == nil {
		return nil, nil // the wait passed
	}
	return msgs, err
}

// halfTxs returns one page: the transactions after r.name, in txid order.
func (sv *service) halfTxs(p partition.Partition, r *partReq) (page []store.HalfTx, more bool, err error) {
	limit := min(halfPage(r.limit), sv.budget/halfTxBytes)
	err = p.HalfTxs(func(h store.HalfTx) bool {
		if h.TxID <= r.name {
			return true
		}
		if len(page) == limit {
			more = true
			return false
		}
		page = append(page, h)
		return true
	})
	return page, more, err
}
