package transport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// stream is a yamux stream of one group, addressed by node ids: a
// net.Conn for raft's NetworkTransport.
//
// An inbound stream (check set) gives raft only bytes that its rpcCheck
// passed, and is closed after the mux's IdleTimeout without a byte. raft
// pools the streams it dials and takes one again however long it lay
// unused, so a dialed stream that was idle for half the IdleTimeout is
// replaced by a new stream of the group to the same node when raft writes
// to it again, at the start of a request: raft never sends a request into
// a stream its peer closed as idle.
type stream struct {
	l     *RaftLayer
	peer  string
	check *rpcCheck    // inbound only; used by raft's reading goroutine
	in    *inSession   // inbound only: the session it came in on
	last  atomic.Int64 // dialed only: unix ns of the last read or write

	mu     sync.Mutex
	ys     *yamux.Stream // guarded by mu: a dialed stream's is replaced when it was idle
	dead   bool          // guarded by mu: closed; no deadline is set again
	rdl    time.Time     // guarded by mu: raft's read deadline
	wdl    time.Time     // guarded by mu: raft's write deadline
	closed sync.Once
}

func (s *stream) touch() { s.last.Store(time.Now().UnixNano()) }

// Read reads the stream. An inbound stream's bytes pass its rpcCheck
// first: a request that fails it closes the stream, and Read returns the
// error without the bytes.
func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return 0, fmt.Errorf("%w: %w", ErrClosed, net.ErrClosed)
	}
	ys := s.ys
	if s.check != nil {
		dl := time.Now().Add(s.l.m.cfg.IdleTimeout)
		if !s.rdl.IsZero() && s.rdl.Before(dl) {
			dl = s.rdl
		}
		if err := ys.SetReadDeadline(dl); err != nil {
			s.mu.Unlock()
			return 0, err
		}
	}
	s.mu.Unlock()
	n, err := ys.Read(p)
	if s.check == nil {
		s.touch()
		return n, err
	}
	if n > 0 {
		if cerr := s.check.feed(p[:n]); errors.Is(cerr, errWithheld) {
			s.kill()
			return 0, cerr
		} else if cerr != nil {
			s.l.m.refused(s.peer, s.l.group, "transport: closed raft stream: a request not from the peer, or not raft's", "err", cerr)
			s.kill()
			s.l.m.refuse(s.in)
			return 0, cerr
		}
	}
	return n, err
}

// Write writes to the stream; a dialed stream idle for half the mux's
// IdleTimeout is replaced first.
func (s *stream) Write(p []byte) (int, error) {
	ys, err := s.writable()
	if err != nil {
		return 0, err
	}
	n, err := ys.Write(p)
	if s.check == nil {
		s.touch()
	}
	return n, err
}

// writable returns the yamux stream to write to, after replacing a dialed
// one that was idle.
func (s *stream) writable() (*yamux.Stream, error) {
	s.mu.Lock()
	dead, ys, wdl := s.dead, s.ys, s.wdl
	s.mu.Unlock()
	if dead {
		return nil, fmt.Errorf("%w: %w", ErrClosed, net.ErrClosed)
	}
	if s.check != nil || time.Since(time.Unix(0, s.last.Load())) < s.l.m.cfg.IdleTimeout/2 {
		return ys, nil
	}
	timeout := DefaultRaftDialTimeout
	if !wdl.IsZero() {
		timeout = time.Until(wdl)
		if timeout <= 0 {
			return nil, fmt.Errorf("transport: raft stream: %w", os.ErrDeadlineExceeded)
		}
	}
	fresh, err := s.l.m.openStream(s.l, s.peer, timeout)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		fresh.Close()
		return nil, fmt.Errorf("%w: %w", ErrClosed, net.ErrClosed)
	}
	old := s.ys
	s.ys = fresh
	err = fresh.SetReadDeadline(s.rdl)
	if err == nil {
		err = fresh.SetWriteDeadline(s.wdl)
	}
	s.mu.Unlock()
	old.Close()
	s.touch()
	return fresh, err
}

// Close closes the stream and forgets it in its layer.
func (s *stream) Close() error {
	var err error
	s.closed.Do(func() {
		s.l.forget(s)
		s.mu.Lock()
		s.dead = true
		ys := s.ys
		s.mu.Unlock()
		err = ys.Close()
	})
	return err
}

// kill closes the stream and ends raft's reads and writes on it: a yamux
// Close alone only ends our writes.
func (s *stream) kill() {
	s.mu.Lock()
	s.dead = true
	ys := s.ys
	s.mu.Unlock()
	_ = ys.SetDeadline(time.Unix(1, 0))
	s.Close()
}

func (s *stream) SetDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rdl, s.wdl = t, t
	if s.dead {
		return nil
	}
	return s.ys.SetDeadline(t)
}

func (s *stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rdl = t
	if s.dead {
		return nil
	}
	return s.ys.SetReadDeadline(t)
}

func (s *stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wdl = t
	if s.dead {
		return nil
	}
	return s.ys.SetWriteDeadline(t)
}

func (s *stream) LocalAddr() net.Addr  { return nodeAddr(s.l.m.t.NodeID()) }
func (s *stream) RemoteAddr() net.Addr { return nodeAddr(s.peer) }
