package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
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
	name        string // "topic/index"
	callTimeout time.Duration

	mu      sync.Mutex
	local   *partition.Local  // open here: this node holds the partition, or hands it over
	far     *remote.Partition // the partition's node's, while that is another
	farNode string            // that node
	since   time.Time         // when local was thawed here: its leases (partition.AwaitLeases)
	changed chan struct{}     // closed and replaced at each change of local and far
	closed  bool
	snap    moveSnap // the snapshot handed to the node the partition moves to (move.go)
}

func newSingle(topic string, index int) *single {
	return &single{name: topic + "/" + strconv.Itoa(index), callTimeout: 10 * time.Second, changed: make(chan struct{})}
}

var _ partition.Partition = (*single)(nil)

// set makes local, or far on node farNode, where calls go, closing what
// they replace before it returns. Calls running on a replaced partition
// that fail with store.ErrClosed run again on the new one.
func (s *single) set(local *partition.Local, far *remote.Partition, farNode string, since time.Time) {
	s.mu.Lock()
	oldLocal, oldFar := s.local, s.far
	if s.closed {
		s.mu.Unlock()
		closeBoth(local, far)
		return
	}
	s.local, s.far, s.farNode, s.since = local, far, farNode, since
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	if oldLocal != local && oldLocal != nil {
		_ = oldLocal.Close()
	}
	if oldFar != far && oldFar != nil {
		oldFar.Close()
	}
}

func closeBoth(local *partition.Local, far *remote.Partition) {
	if local != nil {
		_ = local.Close()
	}
	if far != nil {
		far.Close()
	}
}

// where is where a call goes: local, or far; with neither, the partition
// is moving here. changed is closed when that changes.
type where struct {
	local   *partition.Local
	far     *remote.Partition
	farNode string
	since   time.Time
	changed <-chan struct{}
}

// at returns where a call goes now.
func (s *single) at() (where, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return where{}, fmt.Errorf("%w: %s", store.ErrClosed, s.name)
	}
	return where{local: s.local, far: s.far, farNode: s.farNode, since: s.since, changed: s.changed}, nil
}

// do runs fn where the partition is, again each time it finds it frozen
// or moved under it, until ctx ends.
func (s *single) do(ctx context.Context, fn func(p partition.Partition, local *partition.Local, since time.Time) error) error {
	backoff := 5 * time.Millisecond
	for {
		w, err := s.at()
		if err != nil {
			return err
		}
		switch {
		case w.local != nil:
			err = fn(w.local, w.local, w.since)
		case w.far != nil:
			err = fn(w.far, nil, time.Time{})
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

// call is do for the reads that take no ctx.
func (s *single) call(fn func(p partition.Partition) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.callTimeout)
	defer cancel()
	return s.do(ctx, func(p partition.Partition, _ *partition.Local, _ time.Time) error { return fn(p) })
}

// Apply runs cmd where the partition is. A claim here within a lease of
// the partition's arrival waits for the leases stamped by the node it
// came from (partition.AwaitLeases).
func (s *single) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	var res store.Result
	err := s.do(ctx, func(p partition.Partition, local *partition.Local, since time.Time) (err error) {
		if local != nil {
			if err := partition.AwaitLeases(since, cmd, func() (*store.Partition, error) { return local.Partition, nil }); err != nil {
				return err
			}
		}
		res, err = p.Apply(ctx, cmd)
		return err
	})
	return res, err
}

func (s *single) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error) {
	var out []store.Message
	err := s.do(ctx, func(p partition.Partition, _ *partition.Local, _ time.Time) (err error) {
		out, err = p.Fetch(ctx, from, max, maxBytes, dst)
		return err
	})
	return out, err
}

func (s *single) Get(offset uint64) (m store.Message, ok bool, err error) {
	err = s.call(func(p partition.Partition) (err error) {
		m, ok, err = p.Get(offset)
		return err
	})
	return m, ok, err
}

// Stats is the partition's where it is; zero while it cannot be reached.
func (s *single) Stats() store.Stats {
	w, err := s.at()
	switch {
	case err != nil:
	case w.local != nil:
		return w.local.Stats()
	case w.far != nil:
		return w.far.Stats()
	}
	return store.Stats{}
}

func (s *single) Group(name string) (g store.GroupState, ok bool, err error) {
	err = s.call(func(p partition.Partition) (err error) {
		g, ok, err = p.Group(name)
		return err
	})
	return g, ok, err
}

func (s *single) GroupStates() (gs map[string]store.GroupState, err error) {
	err = s.call(func(p partition.Partition) (err error) {
		gs, err = p.GroupStates()
		return err
	})
	return gs, err
}

func (s *single) SeekTime(t int64) (off uint64, err error) {
	err = s.call(func(p partition.Partition) (err error) {
		off, err = p.SeekTime(t)
		return err
	})
	return off, err
}

func (s *single) NextDue() (due int64, ok bool, err error) {
	err = s.call(func(p partition.Partition) (err error) {
		due, ok, err = p.NextDue()
		return err
	})
	return due, ok, err
}

func (s *single) HalfTxs(fn func(store.HalfTx) bool) error {
	return s.call(func(p partition.Partition) error { return p.HalfTxs(fn) })
}

func (s *single) Decision(txid string) (d store.Decision, err error) {
	err = s.call(func(p partition.Partition) (err error) {
		d, err = p.Decision(txid)
		return err
	})
	return d, err
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
	local, far := s.local, s.far
	s.local, s.far = nil, nil
	close(s.changed)
	s.mu.Unlock()
	var err error
	if local != nil {
		err = local.Close()
	}
	if far != nil {
		far.Close()
	}
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

// removeFiles deletes the partition file at path and the move's snapshot
// beside it, the partition moved away, leaving a tombstone (".gone") in
// their place, synced first: a state behind the move never has this node
// make the partition anew, empty.
func removeFiles(path string) error {
	if err := boltsafe.ReplaceFile(path+goneSuffix, nil); err != nil {
		return err
	}
	return errors.Join(store.RemoveFile(path), store.RemoveFile(path+moveSnapSuffix), store.RemoveFile(path+moveInSuffix))
}
