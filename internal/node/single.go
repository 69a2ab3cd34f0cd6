package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/store"
)

// single is a partition of a Single topic as a cluster node's table holds
// it, for the table's life: the partition on its node, stored here (local)
// or reached by RPC (far), which a move changes (metastate.MoveReplica,
// MoveDone; move.go). A call that meets the partition frozen, or closed
// under it by a move, waits until the placement changes and runs where the
// partition is then, until its ctx ends: producers and consumers ride
// through a move. Safe for concurrent use.
type single struct {
	partition.Reads // run where the partition is (read)
	name            string
	ctx             context.Context // ends at Close
	cancel          context.CancelFunc

	mu     sync.Mutex
	cur    where // cur.changed is closed and replaced at each change
	closed bool
	snap   moveSnap // the snapshot handed to the node the partition moves to (move.go)
}

// where is where a call goes: local, or far; with neither, the partition
// is moving here. changed is closed when that changes.
type where struct {
	local   *partition.Local  // open here: this node holds the partition, or hands it over
	far     *remote.Partition // the partition's node's, while that is another
	farNode string            // that node
	since   time.Time         // when local was thawed here: its leases (partition.AwaitLeases)
	changed chan struct{}
}

func newSingle(topic string, index int) *single {
	s := &single{name: topic + "/" + strconv.Itoa(index), cur: where{changed: make(chan struct{})}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.Reads = partition.Reads{At: s.read, Ctx: s.ctx, Timeout: replica.DefaultCallTimeout}
	return s
}

var _ partition.Partition = (*single)(nil)

// set makes w, without its changed, where calls go, closing what it
// replaces before it returns. Calls running on a replaced partition that
// fail with store.ErrClosed run again on the new one.
func (s *single) set(w where) {
	s.mu.Lock()
	old := s.cur
	if s.closed {
		s.mu.Unlock()
		w.closeBut(where{})
		return
	}
	w.changed = old.changed
	s.cur = w
	s.signalLocked()
	s.mu.Unlock()
	old.closeBut(w)
}

// closeBut closes the partitions of w that keep does not hold.
func (w where) closeBut(keep where) error {
	var err error
	if w.local != nil && w.local != keep.local {
		err = w.local.Close()
	}
	if w.far != nil && w.far != keep.far {
		w.far.Close()
	}
	return err
}

// signalLocked tells whatever waits for the partition to change that it
// may have: calls waiting through a move, the upkeep (whileHere). s.mu is
// held.
func (s *single) signalLocked() {
	close(s.cur.changed)
	s.cur.changed = make(chan struct{})
}

// kick is signalLocked for a change of the partition here: its freeze.
func (s *single) kick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.signalLocked()
	}
}

// at returns where a call goes now.
func (s *single) at() (where, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return where{}, fmt.Errorf("%w: %s", store.ErrClosed, s.name)
	}
	return s.cur, nil
}

// do runs fn where the partition is, again each time it finds it frozen
// or moved under it, until ctx ends.
func (s *single) do(ctx context.Context, fn func(p partition.Partition, w where) error) error {
	backoff := 5 * time.Millisecond
	for {
		w, err := s.at()
		if err != nil {
			return err
		}
		switch {
		case w.local != nil:
			err = fn(w.local, w)
		case w.far != nil:
			err = fn(w.far, w)
		default:
			err = fmt.Errorf("%w: %s is moving to this node", store.ErrFrozen, s.name)
		}
		if err == nil || !s.moving(err, w.changed) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is moving to another node: %w (%w)", s.name, ctx.Err(), err)
		case <-w.changed:
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// moving reports whether err says the partition was frozen, or closed
// by a move under the call (changed closed since it began): nothing ran.
func (s *single) moving(err error, changed <-chan struct{}) bool {
	if errors.Is(err, store.ErrFrozen) {
		return true
	}
	if !errors.Is(err, store.ErrClosed) {
		return false
	}
	// Closed under the call: by a move if the placement changed since.
	select {
	case <-changed:
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.closed
	default:
		return false
	}
}

// read is Reads.At: do for the reads.
func (s *single) read(ctx context.Context, fn func(p partition.Partition) error) error {
	return s.do(ctx, func(p partition.Partition, _ where) error { return fn(p) })
}

// Apply runs cmd where the partition is. A claim here within a lease of
// the partition's arrival waits for the leases stamped by the node it
// came from (partition.AwaitLeases).
func (s *single) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	var res store.Result
	err := s.do(ctx, func(p partition.Partition, w where) (err error) {
		if w.local != nil {
			if err := partition.AwaitLeases(w.since, cmd, func() (*store.Partition, error) { return w.local.Partition, nil }); err != nil {
				return err
			}
		}
		res, err = p.Apply(ctx, cmd)
		return err
	})
	return res, err
}

// Stats is the partition's where it is; zero while it cannot be reached.
func (s *single) Stats() store.Stats { return s.StatsContext(context.Background()) }

// StatsContext is Stats ending with ctx.
func (s *single) StatsContext(ctx context.Context) store.Stats {
	w, err := s.at()
	switch {
	case err != nil:
	case w.local != nil:
		return w.local.Stats()
	case w.far != nil:
		return w.far.StatsContext(ctx)
	}
	return store.Stats{}
}

// Close closes the partition here, or the RPC partition, and ends the
// calls waiting for a move.
func (s *single) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	old := s.cur
	s.cur = where{}
	close(old.changed)
	s.mu.Unlock()
	s.cancel()
	err := old.closeBut(where{})
	s.dropSnap()
	return err
}

// served is the partition as this node serves it to another's RPC: the
// partition here, frozen or not, which refuses commands while frozen;
// otherwise store.ErrFrozen, so that the caller waits for its placement
// to change.
func (s *single) served() (*partition.Local, error) {
	w, err := s.at()
	switch {
	case err != nil:
		return nil, err
	case w.local == nil:
		return nil, fmt.Errorf("%w: %s is not on this node", store.ErrFrozen, s.name)
	}
	return w.local, nil
}

// owned reports whether the partition is here and not frozen: this node
// checks its transactions back.
func (s *single) owned() bool {
	w, err := s.at()
	return err == nil && w.local != nil && w.local.Frozen() == 0
}

// whileHere runs fn with the partition while it is here and not frozen,
// with a ctx that ends when it leaves or freezes (each change closes
// changed: set, kick), until ctx ends: the upkeep's.
func (s *single) whileHere(ctx context.Context, fn func(ctx context.Context, l *partition.Local)) {
	for ctx.Err() == nil {
		w, err := s.at()
		if err != nil {
			return
		}
		if w.local != nil && w.local.Frozen() == 0 {
			lctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Go(func() { fn(lctx, w.local) })
			select {
			case <-ctx.Done():
			case <-w.changed:
			}
			cancel()
			wg.Wait()
			continue
		}
		select {
		case <-ctx.Done():
		case <-w.changed:
		}
	}
}
