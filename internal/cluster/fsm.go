package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/metastate"
)

// fsm is the metadata group's raft.FSM. Raft calls Apply, Snapshot and
// Restore from one goroutine; readers load the current State without a lock.
type fsm struct {
	cur atomic.Pointer[metastate.State]
	// cached is the state cache a node restarted with (see cache.go),
	// shown instead of cur until cur reaches its index; nil then.
	cached atomic.Pointer[metastate.State]
	log    *slog.Logger
}

var _ raft.FSM = (*fsm)(nil)

func newFSM(log *slog.Logger) *fsm {
	f := &fsm{log: log}
	f.cur.Store(metastate.New())
	return f
}

// state returns the current State: the applied one, or the cached one
// while it is newer.
func (f *fsm) state() *metastate.State {
	s := f.cur.Load()
	if c := f.cached.Load(); c != nil && c.Index() > s.Index() {
		return c
	}
	return s
}

// seed shows c until the applied state reaches its index.
func (f *fsm) seed(c *metastate.State) {
	f.cached.Store(c)
}

// applyResponse is what fsm.Apply returns to raft's ApplyFuture.
type applyResponse struct {
	res metastate.Result
	err error
}

// applyCommand applies c at log index index and publishes the new State.
func (f *fsm) applyCommand(index uint64, c metastate.Command) (metastate.Result, error) {
	next, res, err := f.cur.Load().Apply(index, c)
	if err != nil {
		return res, err
	}
	f.publish(next)
	return res, nil
}

// publish makes s the current State and wakes the watchers of the old one.
func (f *fsm) publish(s *metastate.State) {
	old := f.cur.Swap(s)
	old.Replaced()
	if c := f.cached.Load(); c != nil && s.Index() >= c.Index() && f.cached.CompareAndSwap(c, nil) {
		c.Replaced() // its watchers read state again: s
	}
}

// Apply implements raft.FSM.
func (f *fsm) Apply(l *raft.Log) any {
	c, err := metastate.DecodeCommand(l.Data)
	if err != nil {
		// Every node refuses the same bytes alike.
		f.log.Error("metadata log entry does not decode", "index", l.Index, "err", err)
		return applyResponse{metastate.Result{Index: l.Index}, err}
	}
	res, err := f.applyCommand(l.Index, c)
	return applyResponse{res, err}
}

// Snapshot implements raft.FSM: the current State is immutable, so the
// snapshot is the pointer, encoded in Persist.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	return fsmSnapshot{f.cur.Load()}, nil
}

// Restore implements raft.FSM.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read metadata snapshot: %w", err)
	}
	s, err := metastate.DecodeSnapshot(b)
	if err != nil {
		return err
	}
	f.publish(s)
	return nil
}

type fsmSnapshot struct{ s *metastate.State }

func (fs fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	b, err := metastate.EncodeSnapshot(fs.s)
	if err == nil {
		_, err = sink.Write(b)
	}
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist metadata snapshot: %w", err)
	}
	return sink.Close()
}

func (fsmSnapshot) Release() {}
