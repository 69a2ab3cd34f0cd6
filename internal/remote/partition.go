package remote

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/store"
)

// Defaults of PartitionConfig's zero values.
const (
	DefaultMaxWait     = 5 * time.Second
	DefaultCallTimeout = 10 * time.Second
	DefaultHalfPage    = 128
)

// PartitionConfig configures a remote Partition. Zero values take the
// defaults.
type PartitionConfig struct {
	// MaxWait bounds the wait of one Fetch request, DefaultMaxWait if zero:
	// a Fetch waiting longer sends another when the server answers an empty
	// batch. It must be below the server's IdleTimeout.
	MaxWait time.Duration
	// CallTimeout bounds the calls that take no ctx, and a Fetch request
	// beyond its wait; zero means DefaultCallTimeout. The calls without ctx
	// are Get, Stats, Group, GroupStates, SeekTime, NextDue, a page of
	// HalfTxs and Decision.
	CallTimeout time.Duration
	// HalfPage is the transactions one HalfTxs request asks for. Zero means
	// DefaultHalfPage.
	HalfPage int
}

// Partition is a partition served by another node, reached through a
// Client: every method is one or more calls. Safe for concurrent use.
//
// Upkeep, which releases and trims, never runs on a remote partition: it
// runs where the partition is.
type Partition struct {
	c      *Client
	topic  string
	index  int
	cfg    PartitionConfig
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	bufs   sync.Pool // *[]byte Apply requests

	mu   sync.Mutex
	last store.Stats // guarded by mu: the last stats seen
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
	p := &Partition{c: c, topic: topic, index: index, cfg: cfg}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// call makes one call on behalf of p: Close ends it with store.ErrClosed,
// a positive timeout with an error wrapping ErrUnavailable and
// context.DeadlineExceeded, ctx with ctx.Err(). A read, being idempotent,
// is tried again once when the connection broke, as the peer closes idle
// connections.
//
// The reply is in *buf: give it back to the client with putReply once
// decoded, since every decoder copies what it keeps.
func (p *Partition) call(ctx context.Context, op uint16, req []byte, timeout time.Duration, idempotent bool) (resp []byte, buf *[]byte, err error) {
	if p.ctx.Err() != nil {
		return nil, nil, store.ErrClosed
	}
	// Close ends the call through the stop channel, with no context
	// derived per call for it: Apply, the sends' path, derives none.
	cctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	stop := p.ctx.Done()
	resp, buf, err = p.c.call(cctx, stop, op, req)
	if err != nil && idempotent && errors.Is(err, ErrUnavailable) && cctx.Err() == nil && p.ctx.Err() == nil {
		resp, buf, err = p.c.call(cctx, stop, op, req)
	}
	switch {
	case err == nil:
		return resp, buf, nil
	case p.ctx.Err() != nil, errors.Is(err, ErrClosed):
		return nil, nil, store.ErrClosed
	case ctx.Err() != nil:
		return nil, nil, ctx.Err()
	case cctx.Err() != nil: // our timeout, not the caller's
		return nil, nil, fmt.Errorf("%s/%d: %w: no reply in %v: %w", p.topic, p.index, ErrUnavailable, timeout, err)
	case errors.Is(err, ErrUnavailable):
		return nil, nil, fmt.Errorf("%s/%d: %w", p.topic, p.index, err)
	}
	return nil, nil, err
}

// do sends request r of op and decodes the reply, appending Fetch's and
// Get's messages to dst.
func (p *Partition) do(ctx context.Context, op uint16, r *partReq, timeout time.Duration, idempotent bool, dst []store.Message) (*partResp, error) {
	r.topic, r.index = p.topic, p.index
	resp, buf, err := p.call(ctx, op, appendRequest(nil, op, r), timeout, idempotent)
	if err != nil {
		return nil, err
	}
	defer p.c.putReply(buf)
	return decodeReply(op, resp, r, dst)
}

// observe records stats from a reply, for Stats when a call fails.
func (p *Partition) observe(s store.Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = s
}

// Apply sends cmd to the partition and returns its result, with the error
// the partition returned beside it, such as ErrDecided or
// ErrStaleGeneration. cmd is encoded before the call and not read after. A
// zero cmd.Now is stamped by the serving node, the proposer, in the copy it
// receives: cmd is not modified. An error wrapping ErrUnavailable leaves the
// outcome unknown: the command may have been applied.
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
	r := &partReq{topic: p.topic, index: p.index, cmd: cmd}
	*bp = appendRequest((*bp)[:0], OpApply, r)
	if n := wire.FrameHeaderSize + len(*bp); n > p.c.MaxFrameBytes() {
		return store.Result{}, fmt.Errorf("%w: command of %d bytes over the frame limit %d: %w", store.ErrTooLarge, n, p.c.MaxFrameBytes(), wire.ErrFrameTooLarge)
	}
	resp, buf, err := p.call(ctx, OpApply, *bp, 0, false)
	if err != nil {
		return store.Result{}, err
	}
	a, err := decodeReply(OpApply, resp, r, nil)
	p.c.putReply(buf)
	if err != nil {
		return store.Result{}, err
	}
	// An append that succeeded acks every message: its caller reads an
	// ack for each.
	if a.err == nil && cmd.Op == store.OpAppend && len(a.res.Acks) != len(cmd.Msgs) {
		return store.Result{}, fmt.Errorf("%s/%d: %w: %d acks for %d messages", p.topic, p.index, ErrProtocol, len(a.res.Acks), len(cmd.Msgs))
	}
	p.observe(a.stats)
	return a.res, a.err
}

// Fetch reads, as store.Partition.Fetch, up to max messages from from on,
// maxBytes in all past the first, waiting until one is stored, ctx ends,
// with ctx.Err(), or p is closed, with store.ErrClosed. The wait is a long
// poll: requests of at most cfg.MaxWait, repeated. One reply holds at most a
// frame: a Fetch may return fewer messages than max and maxBytes allow, and
// a message too large for a frame fails with store.ErrTooLarge.
func (p *Partition) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error) {
	r := &partReq{from: from, max: clamp32(max), maxBytes: clamp32(maxBytes)}
	n := len(dst)
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
		r.waitMS = uint64(wait.Milliseconds() + 1)
		a, err := p.do(ctx, OpFetch, r, wait+p.cfg.CallTimeout, true, dst[:n])
		if err != nil {
			if ctx.Err() != nil && !errors.Is(err, store.ErrClosed) {
				return dst[:n], ctx.Err()
			}
			return dst[:n], err
		}
		dst = a.msgs
		p.observe(a.stats)
		if len(dst) > n || max <= 0 {
			return dst, nil
		}
	}
}

// clamp32 is v within [0, MaxInt32].
func clamp32(v int) int { return min(max(v, 0), math.MaxInt32) }

// Each read below waits at most cfg.CallTimeout; its XxxContext form ends
// sooner when ctx does (package partition's functions of the same name use
// it).

// Get returns the message at offset, or ok false if the log does not hold
// it.
func (p *Partition) Get(offset uint64) (store.Message, bool, error) {
	return p.GetContext(context.Background(), offset)
}

func (p *Partition) GetContext(ctx context.Context, offset uint64) (store.Message, bool, error) {
	a, err := p.do(ctx, OpGet, &partReq{offset: offset}, p.cfg.CallTimeout, true, nil)
	if err != nil || !a.ok {
		return store.Message{}, false, err
	}
	return a.msgs[0], true, nil
}

// Stats returns the partition's acknowledged state. It has no error to
// return: when the call fails, or p is closed, it returns the last stats
// an Apply, Fetch or Stats of this handle received, zero if none.
func (p *Partition) Stats() store.Stats { return p.StatsContext(context.Background()) }

func (p *Partition) StatsContext(ctx context.Context) store.Stats {
	a, err := p.do(ctx, OpStats, &partReq{}, p.cfg.CallTimeout, true, nil)
	if err != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.last
	}
	p.observe(a.stats)
	return a.stats
}

// Group returns the record of group name, or ok false for a group without
// one.
func (p *Partition) Group(name string) (store.GroupState, bool, error) {
	return p.GroupContext(context.Background(), name)
}

func (p *Partition) GroupContext(ctx context.Context, name string) (store.GroupState, bool, error) {
	a, err := p.do(ctx, OpGroup, &partReq{name: name}, p.cfg.CallTimeout, true, nil)
	if err != nil {
		return store.GroupState{}, false, err
	}
	return a.group, a.ok, nil
}

// GroupStates returns every group's record; as the store's, with an error
// naming damaged records beside the good ones.
func (p *Partition) GroupStates() (map[string]store.GroupState, error) {
	return p.GroupStatesContext(context.Background())
}

func (p *Partition) GroupStatesContext(ctx context.Context) (map[string]store.GroupState, error) {
	a, err := p.do(ctx, OpGroupStates, &partReq{}, p.cfg.CallTimeout, true, nil)
	if err != nil {
		return nil, err
	}
	return a.groups, a.err
}

// SeekTime returns the offset of the first message stored at or after t,
// or Next.
func (p *Partition) SeekTime(t int64) (uint64, error) {
	return p.SeekTimeContext(context.Background(), t)
}

func (p *Partition) SeekTimeContext(ctx context.Context, t int64) (uint64, error) {
	a, err := p.do(ctx, OpSeekTime, &partReq{t: t}, p.cfg.CallTimeout, true, nil)
	if err != nil {
		return 0, err
	}
	return a.offset, nil
}

// NextDue returns the DeliverAt of the earliest delayed message, or ok
// false when none waits.
func (p *Partition) NextDue() (int64, bool, error) { return p.NextDueContext(context.Background()) }

func (p *Partition) NextDueContext(ctx context.Context) (int64, bool, error) {
	a, err := p.do(ctx, OpNextDue, &partReq{}, p.cfg.CallTimeout, true, nil)
	if err != nil {
		return 0, false, err
	}
	return a.due, a.ok, nil
}

// HalfTxs calls fn for each undecided transaction, in txid order, until fn
// returns false. The transactions come in pages of cfg.HalfPage, each
// request asking for those after the last txid seen; fn runs between
// requests, so it may call p. Each page waits at most cfg.CallTimeout.
func (p *Partition) HalfTxs(fn func(store.HalfTx) bool) error {
	return p.HalfTxsContext(context.Background(), fn)
}

func (p *Partition) HalfTxsContext(ctx context.Context, fn func(store.HalfTx) bool) error {
	r := &partReq{limit: p.cfg.HalfPage}
	for {
		a, err := p.do(ctx, OpHalfTxs, r, p.cfg.CallTimeout, true, nil)
		if err != nil {
			return err
		}
		for _, h := range a.halves {
			if h.TxID <= r.name {
				return fmt.Errorf("%w: half transaction %q after %q", ErrProtocol, h.TxID, r.name)
			}
			r.name = h.TxID
			if !fn(h) {
				return nil
			}
		}
		if !a.more || len(a.halves) == 0 {
			return nil
		}
	}
}

// Decision returns the recorded decision for txid.
func (p *Partition) Decision(txid string) (store.Decision, error) {
	return p.DecisionContext(context.Background(), txid)
}

func (p *Partition) DecisionContext(ctx context.Context, txid string) (store.Decision, error) {
	a, err := p.do(ctx, OpDecision, &partReq{name: txid}, p.cfg.CallTimeout, true, nil)
	if err != nil {
		return store.Undecided, err
	}
	return a.decision, nil
}

// Close closes this handle, not the partition it reaches nor the Client:
// calls in flight return store.ErrClosed, and so do later ones. Safe to
// call more than once.
func (p *Partition) Close() error {
	p.cancel()
	return nil
}
