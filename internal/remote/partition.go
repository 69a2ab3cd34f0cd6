package remote

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/wire"
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
)

// Payloads after the request header and the reply's version byte
// (codec.go):
//
//	OpApply       req: the command (store.AppendCommand), all the rest
//	              reply: embedded error (Apply's), result, stats
//	OpFetch       req: from, max, max bytes, wait (ms) uvarint
//	              reply: stats, count uvarint, messages
//	OpGet         req: offset uvarint;      reply: ok bool [, message]
//	OpStats       reply: stats
//	OpGroup       req: name string;         reply: ok bool, group
//	OpGroupStates reply: embedded error, count, each name string + group
//	OpSeekTime    req: t varint;            reply: offset uvarint
//	OpNextDue     reply: ok bool, due varint
//	OpHalfTxs     req: after string, limit uvarint
//	              reply: count, each txid, producer string, first seen,
//	              last check varint, checks, messages uvarint; more bool
//	OpDecision    req: txid string;         reply: decision uint8
const (
	// maxFetchWait bounds the wait a Fetch request asks for.
	maxFetchWait = time.Minute
	// replyReserve is what a reply keeps free of messages for its frame
	// header, version, stats and count.
	replyReserve = 64
	// minMessageBytes is the smallest encoded message, bounding a fetch's
	// count by its reply's size.
	minMessageBytes = 12
	// halfTxBytes bounds one encoded HalfTx.
	halfTxBytes = 2*(store.MaxKeyBytes+binary.MaxVarintLen32) + 4*binary.MaxVarintLen64
	// maxHalfPage bounds a HalfTxs page.
	maxHalfPage = 256
)

// ServePartitions registers the partition service's ops on s: each request
// names a topic and an index, which lookup turns into the partition that
// answers it (its error is the reply's). A served partition's Apply gets
// the command as the caller sent it: a local partition stamps a zero Now
// with this node's clock, this node being the proposer.
func ServePartitions(s *Server, lookup func(topic string, index int) (partition.Partition, error)) {
	sv := &service{lookup: lookup, frame: s.MaxFrameBytes()}
	s.Handle(OpApply, sv.apply)
	s.Handle(OpFetch, sv.fetch)
	s.Handle(OpGet, sv.get)
	s.Handle(OpStats, sv.stats)
	s.Handle(OpGroup, sv.group)
	s.Handle(OpGroupStates, sv.groupStates)
	s.Handle(OpSeekTime, sv.seekTime)
	s.Handle(OpNextDue, sv.nextDue)
	s.Handle(OpHalfTxs, sv.halfTxs)
	s.Handle(OpDecision, sv.decision)
}

type service struct {
	lookup func(topic string, index int) (partition.Partition, error)
	frame  int // the server's MaxFrameBytes
}

// budget is the bytes a reply may give its records.
func (sv *service) budget() int { return sv.frame - wire.FrameHeaderSize - replyReserve }

// open decodes a request's header and looks its partition up.
func (sv *service) open(req []byte) (partition.Partition, *decoder, error) {
	d := &decoder{b: req}
	d.version()
	topic := d.str(maxTopicBytes)
	index := d.int()
	if d.err != nil {
		return nil, nil, d.finish("request header")
	}
	p, err := sv.lookup(topic, index)
	if err != nil {
		return nil, nil, err
	}
	return p, d, nil
}

func newReply() []byte { return []byte{payloadVersion} }

func (sv *service) apply(ctx context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	cmd, err := store.DecodeCommand(d.b)
	if err != nil {
		return nil, err
	}
	// The store returns a result with some errors (ErrDecided names the
	// decision that refused the command, ErrStaleGeneration the record):
	// the reply carries both.
	res, aerr := p.Apply(ctx, cmd)
	out := appendEmbeddedError(newReply(), aerr)
	return appendStats(appendResult(out, &res), p.Stats()), nil
}

func (sv *service) fetch(ctx context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	from, max, maxBytes := d.uvarint(), d.int(), d.int()
	wait := time.Duration(min(d.uvarint(), uint64(maxFetchWait/time.Millisecond))) * time.Millisecond
	if err := d.finish("fetch"); err != nil {
		return nil, err
	}
	budget := sv.budget()
	max = min(max, budget/minMessageBytes)
	if maxBytes <= 0 || maxBytes > budget {
		maxBytes = budget
	}
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	msgs, err := p.Fetch(fctx, from, max, maxBytes, nil)
	if err != nil && !(errors.Is(err, context.DeadlineExceeded) && fctx.Err() != nil && ctx.Err() == nil) {
		return nil, err
	}
	var body []byte
	n := 0
	for i := range msgs {
		before := len(body)
		body = appendMessage(body, &msgs[i])
		if len(body) > budget {
			if n == 0 {
				return nil, fmt.Errorf("%w: message at offset %d takes %d bytes, more than a reply of at most %d holds",
					store.ErrTooLarge, msgs[i].Offset, len(body), budget)
			}
			body = body[:before]
			break
		}
		n++
	}
	out := appendStats(newReply(), p.Stats())
	out = binary.AppendUvarint(out, uint64(n))
	return append(out, body...), nil
}

func (sv *service) get(_ context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	off := d.uvarint()
	if err := d.finish("get"); err != nil {
		return nil, err
	}
	m, ok, err := p.Get(off)
	if err != nil {
		return nil, err
	}
	out := appendBool(newReply(), ok)
	if ok {
		out = appendMessage(out, &m)
		if len(out) > sv.budget() {
			return nil, fmt.Errorf("%w: message at offset %d takes %d bytes, more than a reply of at most %d holds",
				store.ErrTooLarge, off, len(out), sv.budget())
		}
	}
	return out, nil
}

func (sv *service) stats(_ context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	if err := d.finish("stats"); err != nil {
		return nil, err
	}
	return appendStats(newReply(), p.Stats()), nil
}

func (sv *service) group(_ context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	name := d.str(store.MaxKeyBytes)
	if err := d.finish("group"); err != nil {
		return nil, err
	}
	g, ok, err := p.Group(name)
	if err != nil {
		return nil, err
	}
	return appendGroup(appendBool(newReply(), ok), g), nil
}

func (sv *service) groupStates(_ context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	if err := d.finish("group states"); err != nil {
		return nil, err
	}
	states, serr := p.GroupStates()
	out := appendEmbeddedError(newReply(), serr)
	out = binary.AppendUvarint(out, uint64(len(states)))
	for name, g := range states {
		out = appendGroup(appendStr(out, name), g)
	}
	return out, nil
}

func (sv *service) seekTime(_ context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	t := d.varint()
	if err := d.finish("seek time"); err != nil {
		return nil, err
	}
	off, err := p.SeekTime(t)
	if err != nil {
		return nil, err
	}
	return binary.AppendUvarint(newReply(), off), nil
}

func (sv *service) nextDue(_ context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	if err := d.finish("next due"); err != nil {
		return nil, err
	}
	due, ok, err := p.NextDue()
	if err != nil {
		return nil, err
	}
	return binary.AppendVarint(appendBool(newReply(), ok), due), nil
}

// halfTxs answers one page: the transactions after the cursor, in txid
// order.
func (sv *service) halfTxs(_ context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	after := d.str(store.MaxKeyBytes)
	limit := d.int()
	if err := d.finish("half transactions"); err != nil {
		return nil, err
	}
	limit = min(max(limit, 1), maxHalfPage, sv.budget()/halfTxBytes)
	var page []store.HalfTx
	more := false
	err = p.HalfTxs(func(h store.HalfTx) bool {
		if h.TxID <= after {
			return true
		}
		if len(page) == limit {
			more = true
			return false
		}
		page = append(page, h)
		return true
	})
	if err != nil {
		return nil, err
	}
	out := binary.AppendUvarint(newReply(), uint64(len(page)))
	for _, h := range page {
		out = appendStr(out, h.TxID)
		out = appendStr(out, h.Producer)
		out = binary.AppendVarint(out, h.FirstSeen)
		out = binary.AppendVarint(out, h.LastCheck)
		out = binary.AppendUvarint(out, uint64(max(h.Checks, 0)))
		out = binary.AppendUvarint(out, uint64(max(h.Messages, 0)))
	}
	return appendBool(out, more), nil
}

func (sv *service) decision(_ context.Context, _ string, req []byte) ([]byte, error) {
	p, d, err := sv.open(req)
	if err != nil {
		return nil, err
	}
	txid := d.str(store.MaxKeyBytes)
	if err := d.finish("decision"); err != nil {
		return nil, err
	}
	dec, err := p.Decision(txid)
	if err != nil {
		return nil, err
	}
	return append(newReply(), byte(dec)), nil
}

// Defaults of PartitionConfig's zero values.
const (
	DefaultMaxWait     = 5 * time.Second
	DefaultCallTimeout = 10 * time.Second
	DefaultHalfPage    = 128
)

// PartitionConfig configures a remote Partition. Zero values take the
// defaults.
type PartitionConfig struct {
	// MaxWait bounds the wait of one Fetch request (DefaultMaxWait if
	// zero): a Fetch waiting longer sends another when the server answers
	// an empty batch. It must be below the server's IdleTimeout.
	MaxWait time.Duration
	// CallTimeout bounds the calls that take no ctx (Get, Stats, Group,
	// GroupStates, SeekTime, NextDue, a page of HalfTxs, Decision), and a
	// Fetch request beyond its wait (DefaultCallTimeout if zero).
	CallTimeout time.Duration
	// HalfPage is the transactions one HalfTxs request asks for
	// (DefaultHalfPage if zero).
	HalfPage int
}

// Partition is a partition served by another node, reached through a
// Client: every method is one or more calls. Safe for concurrent use.
//
// Upkeep (release, trim) never runs on a remote partition: it runs where
// the partition is. Changed is only a hint, closed when a Fetch or an Apply
// through this handle sees the log or the delay index grow: a Changed
// channel does not close for growth nobody here observed.
type Partition struct {
	c      *Client
	topic  string
	index  int
	cfg    PartitionConfig
	hdr    []byte          // the request header, read only
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	bufs   sync.Pool // *[]byte Apply requests

	mu      sync.Mutex
	last    store.Stats   // guarded by mu: the last stats seen
	seen    bool          // guarded by mu: last is set
	changed chan struct{} // guarded by mu
}

var _ partition.Partition = (*Partition)(nil)

// NewPartition returns the partition index of topic served by the peer c
// calls. It does not call the peer.
func NewPartition(c *Client, topic string, index int, cfg PartitionConfig) *Partition {
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.HalfPage <= 0 {
		cfg.HalfPage = DefaultHalfPage
	}
	p := &Partition{c: c, topic: topic, index: index, cfg: cfg, changed: make(chan struct{})}
	p.hdr = binary.AppendUvarint(appendStr([]byte{payloadVersion}, topic), uint64(index))
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// call makes one call on behalf of p: Close ends it with store.ErrClosed,
// timeout (if positive) with an error wrapping ErrUnavailable and
// context.DeadlineExceeded, ctx with ctx.Err(). A read (idempotent)
// is tried again once when the connection broke, as the peer closes idle
// connections.
func (p *Partition) call(ctx context.Context, op uint16, req []byte, timeout time.Duration, idempotent bool) ([]byte, error) {
	if p.ctx.Err() != nil {
		return nil, store.ErrClosed
	}
	var cctx context.Context
	var cancel context.CancelFunc
	if timeout > 0 {
		cctx, cancel = context.WithTimeout(ctx, timeout)
	} else {
		cctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	resp, err := p.c.Call(cctx, op, req)
	if err != nil && idempotent && errors.Is(err, ErrUnavailable) && cctx.Err() == nil {
		resp, err = p.c.Call(cctx, op, req)
	}
	switch {
	case err == nil:
		return resp, nil
	case p.ctx.Err() != nil, errors.Is(err, ErrClosed):
		return nil, store.ErrClosed
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case cctx.Err() != nil: // our timeout, not the caller's
		return nil, fmt.Errorf("%s/%d: %w: no reply in %v: %w", p.topic, p.index, ErrUnavailable, timeout, err)
	case errors.Is(err, ErrUnavailable):
		return nil, fmt.Errorf("%s/%d: %w", p.topic, p.index, err)
	}
	return nil, err
}

// request returns the request header followed by what add appends.
func (p *Partition) request(add func([]byte) []byte) []byte {
	b := append(make([]byte, 0, len(p.hdr)+32), p.hdr...)
	if add != nil {
		b = add(b)
	}
	return b
}

// observe records stats from a reply and closes Changed if the log or the
// delay index grew since the last ones.
func (p *Partition) observe(s store.Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.seen || s.Next > p.last.Next || s.Delayed > p.last.Delayed {
		close(p.changed)
		p.changed = make(chan struct{})
	}
	p.last, p.seen = s, true
}

// decode decodes a reply's payload with fn.
func decode(resp []byte, what string, fn func(d *decoder)) error {
	d := &decoder{b: resp}
	d.version()
	if d.err == nil {
		fn(d)
	}
	return d.finish(what)
}

// Apply sends cmd to the partition and returns its result. cmd is encoded
// before the call and not read after. A zero cmd.Now is stamped by the
// serving node (the proposer), in the copy it receives: cmd is not
// modified. An error wrapping ErrUnavailable leaves the outcome unknown:
// the command may have been applied.
func (p *Partition) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	bp, _ := p.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	// Call copies the request into its frame before it returns, so the
	// buffer is ours again when it does, whatever ended it.
	defer func() {
		if cap(*bp) <= wbufKeep {
			p.bufs.Put(bp)
		}
	}()
	*bp = store.AppendCommand(append((*bp)[:0], p.hdr...), cmd)
	if n := wire.FrameHeaderSize + len(*bp); n > p.c.MaxFrameBytes() {
		return store.Result{}, fmt.Errorf("%w: command of %d bytes over the frame limit %d: %w", store.ErrTooLarge, n, p.c.MaxFrameBytes(), wire.ErrFrameTooLarge)
	}
	resp, err := p.call(ctx, OpApply, *bp, 0, false)
	if err != nil {
		return store.Result{}, err
	}
	var res store.Result
	var st store.Stats
	var aerr error
	if err := decode(resp, "apply", func(d *decoder) { aerr, res, st = d.embeddedError(), d.result(), d.stats() }); err != nil {
		return store.Result{}, err
	}
	p.observe(st)
	return res, aerr
}

// Fetch reads, as store.Partition.Fetch, up to max messages from from on,
// maxBytes in all past the first, waiting until one is stored, ctx ends
// (ctx.Err()) or p is closed (store.ErrClosed). The wait is a long poll:
// requests of at most cfg.MaxWait, repeated. One reply holds at most a
// frame: a Fetch may return fewer messages than max and maxBytes allow,
// and a message too large for a frame fails with store.ErrTooLarge.
func (p *Partition) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error) {
	max, maxBytes = min(max32(max), math.MaxInt32), max32(maxBytes)
	for {
		if err := ctx.Err(); err != nil {
			return dst, err
		}
		wait := p.cfg.MaxWait
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if wait < 0 {
			wait = 0
		}
		req := p.request(func(b []byte) []byte {
			b = binary.AppendUvarint(b, from)
			b = binary.AppendUvarint(b, uint64(max))
			b = binary.AppendUvarint(b, uint64(maxBytes))
			return binary.AppendUvarint(b, uint64(wait.Milliseconds()+1))
		})
		resp, err := p.call(ctx, OpFetch, req, wait+p.cfg.CallTimeout, true)
		if err != nil {
			if ctx.Err() != nil && !errors.Is(err, store.ErrClosed) {
				return dst, ctx.Err()
			}
			return dst, err
		}
		n := len(dst)
		var st store.Stats
		err = decode(resp, "fetch", func(d *decoder) {
			st = d.stats()
			count := d.uvarint()
			if d.err == nil && count > uint64(len(d.b))/minMessageBytes {
				d.fail(fmt.Errorf("%d messages in %d bytes", count, len(d.b)))
			}
			for i := uint64(0); i < count && d.err == nil; i++ {
				dst = append(dst, store.Message{})
				d.message(&dst[len(dst)-1])
			}
		})
		if err != nil {
			return dst[:n], err
		}
		p.observe(st)
		if len(dst) > n || max <= 0 {
			return dst, nil
		}
	}
}

// max32 is v, or 0 for a negative v.
func max32(v int) int { return min(max(v, 0), math.MaxInt32) }

// Get returns the message at offset, or ok false if the log does not hold
// it. It waits at most cfg.CallTimeout.
func (p *Partition) Get(offset uint64) (m store.Message, ok bool, err error) {
	resp, err := p.call(context.Background(), OpGet, p.request(func(b []byte) []byte { return binary.AppendUvarint(b, offset) }), p.cfg.CallTimeout, true)
	if err != nil {
		return m, false, err
	}
	err = decode(resp, "get", func(d *decoder) {
		if ok = d.bool(); ok {
			d.message(&m)
		}
	})
	if err != nil {
		return store.Message{}, false, err
	}
	return m, ok, nil
}

// Stats returns the partition's acknowledged state. It has no error to
// return: when the call fails (or p is closed) it returns the last stats
// an Apply, Fetch or Stats of this handle received, zero if none.
func (p *Partition) Stats() store.Stats {
	resp, err := p.call(context.Background(), OpStats, p.request(nil), p.cfg.CallTimeout, true)
	var st store.Stats
	if err == nil {
		err = decode(resp, "stats", func(d *decoder) { st = d.stats() })
	}
	if err != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.last
	}
	p.observe(st)
	return st
}

// Changed returns a channel closed when a Fetch or an Apply through p next
// sees the log or the delay index grow. Only a hint: see Partition.
func (p *Partition) Changed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// Group returns the record of group name, or ok false for a group without
// one. It waits at most cfg.CallTimeout.
func (p *Partition) Group(name string) (g store.GroupState, ok bool, err error) {
	resp, err := p.call(context.Background(), OpGroup, p.request(func(b []byte) []byte { return appendStr(b, name) }), p.cfg.CallTimeout, true)
	if err != nil {
		return g, false, err
	}
	if err := decode(resp, "group", func(d *decoder) { ok, g = d.bool(), d.group() }); err != nil {
		return store.GroupState{}, false, err
	}
	return g, ok, nil
}

// GroupStates returns every group's record; as the store's, with an error
// naming damaged records beside the good ones. It waits at most
// cfg.CallTimeout.
func (p *Partition) GroupStates() (map[string]store.GroupState, error) {
	resp, err := p.call(context.Background(), OpGroupStates, p.request(nil), p.cfg.CallTimeout, true)
	if err != nil {
		return nil, err
	}
	var serr error
	out := map[string]store.GroupState{}
	err = decode(resp, "group states", func(d *decoder) {
		serr = d.embeddedError()
		n := d.uvarint()
		for i := uint64(0); i < n && d.err == nil; i++ {
			name := d.str(store.MaxKeyBytes)
			out[name] = d.group()
		}
	})
	if err != nil {
		return nil, err
	}
	return out, serr
}

// SeekTime returns the offset of the first message stored at or after t,
// or Next. It waits at most cfg.CallTimeout.
func (p *Partition) SeekTime(t int64) (uint64, error) {
	resp, err := p.call(context.Background(), OpSeekTime, p.request(func(b []byte) []byte { return binary.AppendVarint(b, t) }), p.cfg.CallTimeout, true)
	if err != nil {
		return 0, err
	}
	var off uint64
	if err := decode(resp, "seek time", func(d *decoder) { off = d.uvarint() }); err != nil {
		return 0, err
	}
	return off, nil
}

// NextDue returns the DeliverAt of the earliest delayed message, or ok
// false when none waits. It waits at most cfg.CallTimeout.
func (p *Partition) NextDue() (due int64, ok bool, err error) {
	resp, err := p.call(context.Background(), OpNextDue, p.request(nil), p.cfg.CallTimeout, true)
	if err != nil {
		return 0, false, err
	}
	if err := decode(resp, "next due", func(d *decoder) { ok, due = d.bool(), d.varint() }); err != nil {
		return 0, false, err
	}
	return due, ok, nil
}

// HalfTxs calls fn for each undecided transaction, in txid order, until fn
// returns false. The transactions come in pages of cfg.HalfPage, each
// request asking for those after the last txid seen; fn runs between
// requests, so it may call p (a transaction fn decides is gone from the
// next page). Each page waits at most cfg.CallTimeout.
func (p *Partition) HalfTxs(fn func(store.HalfTx) bool) error {
	after := ""
	for {
		req := p.request(func(b []byte) []byte {
			return binary.AppendUvarint(appendStr(b, after), uint64(p.cfg.HalfPage))
		})
		resp, err := p.call(context.Background(), OpHalfTxs, req, p.cfg.CallTimeout, true)
		if err != nil {
			return err
		}
		var page []store.HalfTx
		more := false
		err = decode(resp, "half transactions", func(d *decoder) {
			n := d.uvarint()
			for i := uint64(0); i < n && d.err == nil; i++ {
				h := store.HalfTx{TxID: d.str(store.MaxKeyBytes), Producer: d.str(store.MaxKeyBytes),
					FirstSeen: d.varint(), LastCheck: d.varint(), Checks: d.int(), Messages: d.int()}
				if d.err == nil && h.TxID <= after {
					d.fail(fmt.Errorf("txid %q not after %q", h.TxID, after))
				}
				after = h.TxID
				page = append(page, h)
			}
			more = d.bool()
		})
		if err != nil {
			return err
		}
		for _, h := range page {
			if !fn(h) {
				return nil
			}
		}
		if !more {
			return nil
		}
	}
}

// Decision returns the recorded decision for txid. It waits at most
// cfg.CallTimeout.
func (p *Partition) Decision(txid string) (store.Decision, error) {
	resp, err := p.call(context.Background(), OpDecision, p.request(func(b []byte) []byte { return appendStr(b, txid) }), p.cfg.CallTimeout, true)
	if err != nil {
		return store.Undecided, err
	}
	dec := store.Undecided
	err = decode(resp, "decision", func(d *decoder) {
		dec = store.Decision(d.byte())
		if dec > store.RolledBack {
			d.fail(fmt.Errorf("decision %d", dec))
		}
	})
	if err != nil {
		return store.Undecided, err
	}
	return dec, nil
}

// Close closes this handle, not the partition it reaches nor the Client:
// calls in flight return store.ErrClosed, and so do later ones. Safe to
// call more than once.
func (p *Partition) Close() error {
	p.cancel()
	return nil
}
