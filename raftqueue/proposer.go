package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/faultinject"
	"github.com/zeze-go/mq/store"
)

// proposer is the leader's group commit: one goroutine takes the first
// queued command, waits for one of the InFlight entry slots, then drains
// what queued meanwhile, up to MaxEntryCmds commands or MaxEntryBytes, into
// one raft entry. An entry holds its slot until it is answered. There is no
// timer: entries grow because commands pile up while earlier entries
// commit. A second goroutine, the completer, waits for the entries in order
// and answers their callers with the FSM's results.
//
// Lock order: closeMu alone.
type proposer struct {
	g                    target
	maxBytes, maxCmds    int
	reqs                 chan *request
	slots                chan struct{} // a token per entry in flight
	pending              chan *batch   // proposed entries, in order, to the completer
	stop                 chan struct{} // closed by close: the proposer drains and exits
	done                 sync.WaitGroup
	once                 sync.Once
	closeMu              sync.RWMutex // guards closing; held for reading while enqueuing
	closing              bool
	entries, proposedCmd atomic.Uint64 // for tests and benchmarks: entries proposed, commands in them

	// ackBeforeCommit is set by tests only (here, or for a whole process
	// by faultinject.AckBeforeCommit): the negative control of the fault
	// tests. Each caller is answered as soon as its entry is handed to
	// raft, before it commits, with the offsets the entry would get if it
	// committed next: what a proposer that does not wait for the commit
	// would ack. The linearizability check must fail with it.
	ackBeforeCommit atomic.Bool
	guessNext       []uint64 // run's: per partition, the next offset an early ack hands out

	nparts  int  // the group's partitions
	version byte // of the entries: entryMany for a group of several partitions
}

// request is one Apply call. Its state decides who owns cmd when the
// caller's ctx ends: a request still queued is dropped unread, and one
// taken is encoded before the caller returns.
type request struct {
	cmd     *store.Command
	part    int // the group's partition cmd is for
	state   atomic.Int32
	encoded chan struct{} // cap 1: the proposer no longer reads cmd
	done    chan reply    // cap 1
}

const (
	reqQueued int32 = iota
	reqTaken
	reqGone
)

type reply struct {
	res store.Result
	err error
}

// batch is one proposed entry and its callers, in the entry's order.
type batch struct {
	f     raft.ApplyFuture
	err   error // the proposal failed before raft took it
	reqs  []*request
	early bool // ackBeforeCommit answered its callers already
}

// target is what a proposer proposes through: a Group's raft, or the
// leader of a DoubleWrite Pair.
type target interface {
	// leading reports whether this replica may propose now.
	leading() bool
	// notLeader is the error for a command refused because it does not.
	notLeader() error
	// propose hands an entry to the replication; the future is answered
	// with the FSM's response once the entry is committed and applied.
	propose(data []byte) raft.ApplyFuture
	// Partition is the replica's partition i, for ackBeforeCommit's guess.
	Partition(i int) (*store.Partition, error)
}

func newProposer(g target, cfg Config) *proposer {
	p := &proposer{
		g:        g,
		maxBytes: cfg.MaxEntryBytes,
		maxCmds:  cfg.MaxEntryCmds,
		stop:     make(chan struct{}),
	}
	if p.maxBytes <= 0 {
		p.maxBytes = DefaultMaxEntryBytes
	}
	if p.maxCmds <= 0 {
		p.maxCmds = DefaultMaxEntryCmds
	}
	inflight, depth := cfg.InFlight, cfg.QueueDepth
	if inflight <= 0 {
		inflight = DefaultInFlight
	}
	if depth <= 0 {
		depth = DefaultQueueDepth
	}
	p.ackBeforeCommit.Store(faultinject.AckBeforeCommit.Load())
	p.nparts, p.version, p.guessNext = cfg.Partitions, entryOne, make([]uint64, cfg.Partitions)
	if cfg.Partitions > 1 {
		p.version = entryMany
	}
	p.reqs = make(chan *request, depth)
	p.slots = make(chan struct{}, inflight)
	p.pending = make(chan *batch, inflight)
	p.done.Add(2)
	go func() {
		defer p.done.Done()
		p.run()
	}()
	go func() {
		defer p.done.Done()
		p.complete()
	}()
	return p
}

// apply queues cmd and waits for its answer.
func (p *proposer) apply(ctx context.Context, part int, cmd *store.Command) (store.Result, error) {
	if cmd == nil {
		return store.Result{}, fmt.Errorf("%w: no command", store.ErrBadCommand)
	}
	if err := ctx.Err(); err != nil {
		return store.Result{}, err
	}
	r := &request{cmd: cmd, part: part, encoded: make(chan struct{}, 1), done: make(chan reply, 1)}
	p.closeMu.RLock()
	if p.closing {
		p.closeMu.RUnlock()
		return store.Result{}, ErrClosed
	}
	if !p.g.leading() {
		p.closeMu.RUnlock()
		return store.Result{}, p.g.notLeader()
	}
	select {
	case p.reqs <- r:
		p.closeMu.RUnlock()
	case <-ctx.Done():
		p.closeMu.RUnlock()
		return store.Result{}, ctx.Err()
	}
	select {
	case rep := <-r.done:
		return rep.res, rep.err
	case <-ctx.Done():
	}
	if r.state.CompareAndSwap(reqQueued, reqGone) {
		return store.Result{}, ctx.Err() // never proposed
	}
	<-r.encoded // the proposer took it and is encoding it: never long
	select {
	case rep := <-r.done: // answered meanwhile
		return rep.res, rep.err
	default:
	}
	return store.Result{}, fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
}

// run is the proposer's goroutine.
func (p *proposer) run() {
	defer close(p.pending)
	var reqs []*request
	for {
		var first *request
		select {
		case first = <-p.reqs:
		case <-p.stop:
			p.refuseQueued()
			return
		}
		select {
		case p.slots <- struct{}{}:
		case <-p.stop:
			p.refuse(first)
			p.refuseQueued()
			return
		}
		reqs = append(reqs[:0], first)
	drain:
		for len(reqs) < p.maxCmds {
			select {
			case r := <-p.reqs:
				reqs = append(reqs, r)
			default:
				break drain
			}
		}
		p.propose(reqs)
		clear(reqs)
	}
}

// propose encodes the requests still wanted into entries of at most
// maxBytes, a larger command going alone, and hands each to raft and to
// the completer. It holds an entry slot, which the completer gives back;
// each further entry waits for a slot of its own.
func (p *proposer) propose(reqs []*request) {
	var taken []*request
	var buf []byte
	early := p.ackBeforeCommit.Load()
	var msgs []int // early: the messages of each taken command
	cmds := 0
	flush := func() {
		data := append(entryHeader(make([]byte, 0, len(buf)+16), p.version, p.nparts, cmds), buf...)
		b := &batch{reqs: taken}
		if !p.g.leading() {
			b.err = p.g.notLeader()
		} else {
			b.f = p.g.propose(data)
			if early {
				p.ackEarly(b, msgs)
			}
		}
		p.entries.Add(1)
		p.proposedCmd.Add(uint64(cmds))
		p.pending <- b
	}
	for i, r := range reqs {
		if len(taken) > 0 && len(buf) >= p.maxBytes {
			flush()
			select {
			case p.slots <- struct{}{}:
			case <-p.stop:
				for _, q := range reqs[i:] {
					p.refuse(q)
				}
				return
			}
			taken, buf, msgs, cmds = nil, nil, nil, 0
		}
		if !r.state.CompareAndSwap(reqQueued, reqTaken) {
			continue // its caller is gone: never proposed
		}
		if buf == nil {
			buf = make([]byte, 0, 4096)
		}
		buf = appendEntryCommand(buf, p.version, r.part, r.cmd)
		if early {
			msgs = append(msgs, len(r.cmd.Msgs))
		}
		r.encoded <- struct{}{} // the caller may reuse cmd
		taken = append(taken, r)
		cmds++
	}
	if len(taken) == 0 {
		<-p.slots // nothing to propose: give the slot back
		return
	}
	flush()
}

// ackEarly answers b's callers before b commits, for ackBeforeCommit,
// which only tests set: each message gets the next offset after its
// partition's end and the offsets handed out early before.
func (p *proposer) ackEarly(b *batch, msgs []int) {
	for i, r := range b.reqs {
		if part, err := p.g.Partition(r.part); err == nil {
			p.guessNext[r.part] = max(p.guessNext[r.part], part.Stats().Next)
		}
		acks := make([]store.Ack, msgs[i])
		for k := range acks {
			acks[k].Offset = p.guessNext[r.part]
			p.guessNext[r.part]++
		}
		r.done <- reply{res: store.Result{Acks: acks}}
	}
	b.early = true
}

// refuse answers a request that was never proposed with ErrClosed.
func (p *proposer) refuse(r *request) {
	if r.state.CompareAndSwap(reqQueued, reqTaken) {
		r.encoded <- struct{}{}
		r.done <- reply{err: ErrClosed}
	}
}

// refuseQueued refuses every queued request. No request is queued once
// closing is set under closeMu, so the queue ends.
func (p *proposer) refuseQueued() {
	for {
		select {
		case r := <-p.reqs:
			p.refuse(r)
		default:
			return
		}
	}
}

// complete is the completer's goroutine: it waits for each entry in the
// order proposed and answers its callers.
func (p *proposer) complete() {
	for b := range p.pending {
		err := b.err
		var resp interface{}
		if err == nil {
			if err = b.f.Error(); err == nil {
				resp = b.f.Response()
			}
		}
		<-p.slots
		if b.early {
			continue // answered when proposed
		}
		if err != nil {
			err = outcome(err, p.g)
			for _, r := range b.reqs {
				r.done <- reply{err: err}
			}
			continue
		}
		er, ok := resp.(*entryResult)
		switch {
		case !ok:
			err = fmt.Errorf("%w: the FSM answered %T", ErrUnknownOutcome, resp)
		case er.err != nil && errors.Is(er.err, store.ErrBadCommand):
			err = er.err // the entry could not be decoded, on any replica
		case er.err != nil:
			err = fmt.Errorf("%w: %w", ErrUnknownOutcome, er.err) // committed; this replica failed
		case len(er.res) != len(b.reqs):
			err = fmt.Errorf("%w: %d results for %d commands", ErrUnknownOutcome, len(er.res), len(b.reqs))
		}
		for i, r := range b.reqs {
			if err != nil {
				r.done <- reply{err: err}
			} else {
				r.done <- reply{res: er.res[i], err: er.errs[i]}
			}
		}
	}
}

// outcome maps raft's error for a proposed entry to Apply's.
func outcome(err error, g target) error {
	var nl *NotLeaderError
	switch {
	case errors.As(err, &nl):
		return err
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		// Refused before it was appended: nothing was proposed.
		return fmt.Errorf("%w (%w)", g.notLeader(), err)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w (%w)", g.notLeader(), err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, ErrClosed)
	default: // raft.ErrLeadershipLost, raft.ErrAbortedByRestore, ...
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
}

// close stops the proposer: new and queued commands get ErrClosed, and the
// entries in flight are waited for. Each is applied, or fails when the
// leader steps down: raft answers every entry it took while it runs.
func (p *proposer) close() {
	p.closeMu.Lock()
	p.closing = true
	close(p.stop)
	p.closeMu.Unlock()
	p.done.Wait()
}
