package remote

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/zeze-go/mq/store"
)

// The partition service's ops. Values cross the wire: never renumber.
const (
	OpApply       = FirstOp + 0
	OpFetch       = FirstOp + 1
	OpGet         = FirstOp + 2
	OpStats       = FirstOp + 3
	OpGroup       = FirstOp + 4
	OpGroupStates = FirstOp + 5
	OpSeekTime    = FirstOp + 6
	OpNextDue     = FirstOp + 7
	OpHalfTxs     = FirstOp + 8
	OpDecision    = FirstOp + 9
	lastPartOp    = OpDecision
)

// The payloads of the partition service. A request is the header (codec.go:
// version, topic, index) and then
//
//	OpApply       the command (store.AppendCommand), all the rest
//	OpFetch       from, max, max bytes, wait (ms): uvarint each
//	OpGet         offset uvarint
//	OpGroup       name string
//	OpSeekTime    t varint
//	OpHalfTxs     after string (the last txid of the page before), limit uvarint
//	OpDecision    txid string
//	others        nothing
//
// A reply is the version byte and then
//
//	OpApply       embedded error (Apply's, which may come with a result), result, stats
//	OpFetch       stats, count uvarint, messages
//	OpGet         ok bool [, message]
//	OpStats       stats
//	OpGroup       ok bool, group
//	OpGroupStates embedded error (damaged records), count uvarint, each name string + group
//	OpSeekTime    offset uvarint
//	OpNextDue     ok bool, due varint
//	OpHalfTxs     count uvarint, each txid, producer string, first seen,
//	              last check varint, checks, messages uvarint; more bool
//	OpDecision    decision uint8
const (
	// maxFetchWait bounds the wait a Fetch request asks for.
	maxFetchWait = time.Minute
	// replyReserve is what a reply keeps free of records for its frame
	// header, version, stats and count.
	replyReserve = 64
	// minMessageBytes is the smallest encoded message (offset, length and
	// a record payload: an array header and ten one-byte fields), bounding
	// a count by the bytes left.
	minMessageBytes = 13
	// halfTxBytes bounds one encoded HalfTx.
	halfTxBytes = 2*(store.MaxKeyBytes+binary.MaxVarintLen32) + 4*binary.MaxVarintLen64
	// minHalfTxBytes and minGroupBytes are the smallest encodings; a
	// GroupStates entry is a name and a group.
	minHalfTxBytes = 6
	minGroupBytes  = 5
	// minAckBytes is the smallest encoded ack: offset and flags.
	minAckBytes = 2
	// maxHalfPage bounds a HalfTxs page.
	maxHalfPage = 256
)

// partReq is a decoded request of any op; each op uses some fields.
type partReq struct {
	topic    string
	index    int
	cmd      *store.Command // OpApply
	msgs     []byte         // OpApply: the command's messages, until decodeBody
	from     uint64         // OpFetch
	max      int            // OpFetch
	maxBytes int            // OpFetch
	waitMS   uint64         // OpFetch
	offset   uint64         // OpGet
	name     string         // OpGroup; OpHalfTxs: after; OpDecision: txid
	t        int64          // OpSeekTime
	limit    int            // OpHalfTxs
}

// appendRequest appends the request r of op to dst.
func appendRequest(dst []byte, op uint16, r *partReq) []byte {
	dst = append(dst, payloadVersion)
	dst = appendStr(dst, r.topic)
	dst = binary.AppendUvarint(dst, uint64(r.index))
	switch op {
	case OpApply:
		dst = store.AppendCommand(dst, r.cmd)
	case OpFetch:
		dst = binary.AppendUvarint(dst, r.from)
		dst = binary.AppendUvarint(dst, uint64(r.max))
		dst = binary.AppendUvarint(dst, uint64(r.maxBytes))
		dst = binary.AppendUvarint(dst, r.waitMS)
	case OpGet:
		dst = binary.AppendUvarint(dst, r.offset)
	case OpGroup, OpDecision:
		dst = appendStr(dst, r.name)
	case OpSeekTime:
		dst = binary.AppendVarint(dst, r.t)
	case OpHalfTxs:
		dst = appendStr(dst, r.name)
		dst = binary.AppendUvarint(dst, uint64(r.limit))
	}
	return dst
}

// decodeRequest decodes a request of op whole: decodeRequestHead, then
// decodeBody. Errors wrap ErrProtocol, or store.ErrBadCommand for an
// Apply's command. A command's message bodies point into b.
func decodeRequest(op uint16, b []byte) (*partReq, error) {
	r, err := decodeRequestHead(op, b)
	if err != nil {
		return nil, err
	}
	if err := r.decodeBody(); err != nil {
		return nil, err
	}
	return r, nil
}

// decodeRequestHead decodes a request of op but for an Apply's messages,
// which decodeBody decodes once the server knows from the head that the
// caller may make the request. Errors are decodeRequest's.
func decodeRequestHead(op uint16, b []byte) (*partReq, error) {
	d := &decoder{b: b}
	d.version()
	r := &partReq{topic: d.str(maxTopicBytes), index: d.int()}
	switch op {
	case OpApply:
		if d.err == nil {
			cmd, msgs, err := store.DecodeCommandHead(d.b)
			if err != nil {
				return nil, err
			}
			r.cmd, r.msgs, d.b = cmd, msgs, nil
		}
	case OpFetch:
		r.from, r.max, r.maxBytes, r.waitMS = d.uvarint(), d.int(), d.int(), d.uvarint()
	case OpGet:
		r.offset = d.uvarint()
	case OpGroup, OpDecision:
		r.name = d.str(store.MaxKeyBytes)
	case OpSeekTime:
		r.t = d.varint()
	case OpHalfTxs:
		r.name, r.limit = d.str(store.MaxKeyBytes), d.int()
	case OpStats, OpGroupStates, OpNextDue:
	default:
		return nil, fmt.Errorf("%w: %d", ErrUnknownOp, op)
	}
	if err := d.finish("request", op); err != nil {
		return nil, err
	}
	return r, nil
}

// decodeBody decodes what decodeRequestHead left: an Apply's messages.
func (r *partReq) decodeBody() error {
	if r.cmd == nil {
		return nil
	}
	msgs := r.msgs
	r.msgs = nil
	return store.DecodeMessages(r.cmd, msgs)
}

// partResp is a decoded reply of any op; each op uses some fields.
type partResp struct {
	err      error // OpApply, OpGroupStates: the error beside the result
	res      store.Result
	stats    store.Stats
	msgs     []store.Message // OpFetch; OpGet: one when ok
	ok       bool
	group    store.GroupState
	groups   map[string]store.GroupState
	offset   uint64 // OpSeekTime
	due      int64  // OpNextDue
	halves   []store.HalfTx
	more     bool // OpHalfTxs
	decision store.Decision
}

// appendReply appends the reply a of op to dst, in at most budget bytes
// past dst: a Fetch reply holds the n messages that fit, at least one or
// store.ErrTooLarge; a Get reply fits or is store.ErrTooLarge.
func appendReply(dst []byte, op uint16, a *partResp, budget int) (out []byte, n int, err error) {
	start := len(dst)
	dst = append(dst, payloadVersion)
	switch op {
	case OpApply:
		dst = appendEmbeddedError(dst, a.err)
		dst = appendResult(dst, &a.res)
		dst = appendStats(dst, a.stats)
	case OpFetch:
		dst = appendStats(dst, a.stats)
		// The messages go straight into dst, grown once to about their
		// size, since a reply is up to a frame and growing it by appends
		// copies it several times. They follow room for their count, which
		// takes the bytes of len(a.msgs)'s and is moved only if n's takes
		// fewer.
		dst = slices.Grow(dst, fetchEstimate(a.msgs, budget))
		cnt := len(dst)
		dst = binary.AppendUvarint(dst, uint64(len(a.msgs)))
		body := len(dst)
		for i := range a.msgs {
			before := len(dst)
			dst = appendMessage(dst, &a.msgs[i])
			if len(dst)-start > budget {
				if n == 0 {
					return dst[:start], 0, tooLarge(a.msgs[i].Offset, len(dst)-before, budget)
				}
				dst = dst[:before]
				break
			}
			n++
		}
		var l [binary.MaxVarintLen64]byte
		k := binary.PutUvarint(l[:], uint64(n))
		copy(dst[cnt:], l[:k])
		if cnt+k < body {
			dst = append(dst[:cnt+k], dst[body:]...)
		}
	case OpGet:
		dst = appendBool(dst, a.ok)
		if a.ok {
			dst = appendMessage(dst, &a.msgs[0])
			if len(dst)-start > budget {
				return dst[:start], 0, tooLarge(a.msgs[0].Offset, len(dst)-start, budget)
			}
		}
	case OpStats:
		dst = appendStats(dst, a.stats)
	case OpGroup:
		dst = appendGroup(appendBool(dst, a.ok), a.group)
	case OpGroupStates:
		dst = appendEmbeddedError(dst, a.err)
		dst = binary.AppendUvarint(dst, uint64(len(a.groups)))
		for name, g := range a.groups {
			dst = appendGroup(appendStr(dst, name), g)
		}
	case OpSeekTime:
		dst = binary.AppendUvarint(dst, a.offset)
	case OpNextDue:
		dst = binary.AppendVarint(appendBool(dst, a.ok), a.due)
	case OpHalfTxs:
		dst = binary.AppendUvarint(dst, uint64(len(a.halves)))
		for _, h := range a.halves {
			dst = appendStr(dst, h.TxID)
			dst = appendStr(dst, h.Producer)
			dst = binary.AppendVarint(dst, h.FirstSeen)
			dst = binary.AppendVarint(dst, h.LastCheck)
			dst = binary.AppendUvarint(dst, uint64(max(h.Checks, 0)))
			dst = binary.AppendUvarint(dst, uint64(max(h.Messages, 0)))
		}
		dst = appendBool(dst, a.more)
	case OpDecision:
		dst = append(dst, byte(a.decision))
	}
	return dst, n, nil
}

// fetchEstimate is about the bytes msgs take in a Fetch reply, at most
// budget.
func fetchEstimate(msgs []store.Message, budget int) int {
	n := binary.MaxVarintLen64
	for i := range msgs {
		m := &msgs[i]
		n += len(m.Body) + len(m.ID) + len(m.Key) + 64
		if n >= budget {
			return budget
		}
	}
	return n
}

func tooLarge(off uint64, n, budget int) error {
	return fmt.Errorf("%w: message at offset %d takes %d bytes, more than a reply of at most %d holds", store.ErrTooLarge, off, n, budget)
}

// halfPage is the transactions a HalfTxs page holds at most when limit
// are asked for.
func halfPage(limit int) int { return min(max(limit, 1), maxHalfPage) }

// replyLimit is the most elements a reply of op may hold in answer to r: a
// Fetch's messages, a HalfTxs page's transactions, an Apply's acks. The
// reply's decoder refuses more, so a peer cannot make its caller allocate
// for elements the call did not ask for.
func replyLimit(op uint16, r *partReq) int {
	switch op {
	case OpFetch:
		return max(r.max, 0)
	case OpHalfTxs:
		return halfPage(r.limit)
	case OpApply:
		if r.cmd == nil {
			return 0
		}
		switch r.cmd.Op {
		case store.OpAppend:
			return len(r.cmd.Msgs)
		case store.OpCommitTx:
			// The transaction's half messages come first, which the
			// committer need not know of (a check-back's commit): their
			// acks are bounded by the bytes alone.
			return math.MaxInt32
		}
	}
	return 0
}

// decodeReply decodes a reply of op to the request r; Fetch's and Get's
// messages are appended to the caller's dst, and a.msgs is dst. A reply
// holding more elements than r asked for (replyLimit) is refused, and
// every slice is made once for its count. Errors wrap ErrProtocol.
func decodeReply(op uint16, b []byte, r *partReq, dst []store.Message) (*partResp, error) {
	d := &decoder{b: b}
	d.version()
	a := &partResp{}
	switch op {
	case OpApply:
		a.err, a.res, a.stats = d.embeddedError(), d.result(replyLimit(op, r)), d.stats()
	case OpFetch:
		a.stats = d.stats()
		n := d.count(minMessageBytes, replyLimit(op, r))
		if cap(dst)-len(dst) < n {
			// Made by hand: slices.Grow allocates twice under -race.
			dst = append(make([]store.Message, 0, len(dst)+n), dst...)
		}
		for i := 0; i < n && d.err == nil; i++ {
			dst = append(dst, store.Message{})
			d.message(&dst[len(dst)-1])
		}
		a.msgs = dst
	case OpGet:
		if a.ok = d.bool(); a.ok {
			dst = append(dst, store.Message{})
			d.message(&dst[len(dst)-1])
		}
		a.msgs = dst
	case OpStats:
		a.stats = d.stats()
	case OpGroup:
		a.ok, a.group = d.bool(), d.group()
	case OpGroupStates:
		a.err = d.embeddedError()
		n := d.count(1+minGroupBytes, math.MaxInt32)
		a.groups = make(map[string]store.GroupState, n)
		for i := 0; i < n && d.err == nil; i++ {
			name := d.str(store.MaxKeyBytes)
			if _, dup := a.groups[name]; dup && d.err == nil {
				d.fail(fmt.Errorf("group %q twice", name))
			}
			a.groups[name] = d.group()
		}
	case OpSeekTime:
		a.offset = d.uvarint()
	case OpNextDue:
		a.ok, a.due = d.bool(), d.varint()
	case OpHalfTxs:
		n := d.count(minHalfTxBytes, replyLimit(op, r))
		if n > 0 {
			a.halves = make([]store.HalfTx, 0, n)
		}
		for i := 0; i < n && d.err == nil; i++ {
			h := store.HalfTx{TxID: d.str(store.MaxKeyBytes), Producer: d.str(store.MaxKeyBytes),
				FirstSeen: d.varint(), LastCheck: d.varint(), Checks: d.int(), Messages: d.int()}
			if d.err == nil && len(a.halves) > 0 && h.TxID <= a.halves[len(a.halves)-1].TxID {
				d.fail(fmt.Errorf("txid %q out of order", h.TxID))
			}
			a.halves = append(a.halves, h)
		}
		a.more = d.bool()
	case OpDecision:
		a.decision = store.Decision(d.byte())
		if a.decision > store.RolledBack {
			d.fail(fmt.Errorf("decision %d", a.decision))
		}
	default:
		return nil, fmt.Errorf("%w: reply of unknown op %d", ErrProtocol, op)
	}
	if err := d.finish("reply", op); err != nil {
		return nil, err
	}
	return a, nil
}
