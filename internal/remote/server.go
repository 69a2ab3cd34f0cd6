package remote

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/wire"
)

// Handler answers one request: resp is the reply's payload, err crosses the
// wire as its code and message (RegisterError). ctx is cancelled when the
// connection or the server closes, or the caller gave up (its cancel frame
// arrived). peer is the node id the connection proved. req is the
// handler's; it must not be used once the handler returns. resp is not
// modified by the server, which may still read it after the handler
// returned (a large one is written from where it is, in a later write):
// the handler must not modify it then.
type Handler func(ctx context.Context, peer string, req []byte) (resp []byte, err error)

// Defaults of ServerConfig's zero values.
const (
	DefaultMaxConcurrent = 128
	DefaultIdleTimeout   = 2 * time.Minute
	DefaultReadTimeout   = 30 * time.Second
	DefaultWriteTimeout  = 30 * time.Second
)

// ServerConfig configures a Server. Zero values take the defaults.
type ServerConfig struct {
	// MaxFrameBytes is the largest frame read or written,
	// wire.DefaultMaxFrameBytes if zero; set it to the transport's
	// MaxFrameBytes, which the server does not see. A reply that would not
	// fit is answered with an error wrapping wire.ErrFrameTooLarge.
	MaxFrameBytes int
	// MaxInflightBytes bounds, per connection, the bytes of requests read
	// and of replies not yet written, 2 × MaxFrameBytes if zero; while over
	// it the connection is not read. One frame read while under it and one
	// reply per running handler may pass it.
	MaxInflightBytes int
	// MaxConcurrent bounds the handlers running for one connection,
	// DefaultMaxConcurrent if zero; further requests wait unread. A
	// long poll holds its handler for its wait: a peer with more remote
	// partitions fetching than this makes its other calls wait.
	MaxConcurrent int
	// IdleTimeout closes a connection on which no request arrived and no
	// reply was written for that long, DefaultIdleTimeout if zero. It must
	// exceed the longest a handler runs, such as Fetch's long poll.
	IdleTimeout time.Duration
	// ReadTimeout bounds the reading of one frame from its first byte,
	// DefaultReadTimeout if zero: a peer sending a byte a second is cut.
	ReadTimeout time.Duration
	// WriteTimeout bounds the writing of one reply, DefaultWriteTimeout if
	// zero: a peer that stops reading is cut.
	WriteTimeout time.Duration
	// Logger receives a line for every connection closed on an error; nil
	// is silent.
	Logger *slog.Logger
}

func (c *ServerConfig) setDefaults() {
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = wire.DefaultMaxFrameBytes
	}
	if c.MaxInflightBytes <= 0 {
		c.MaxInflightBytes = 2 * c.MaxFrameBytes
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server answers requests on the connections a listener accepts. Safe for
// concurrent use.
//
// Lock order: Server.mu, then serverConn.mu; serverConn.wmu is taken alone.
type Server struct {
	l      net.Listener
	cfg    ServerConfig
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.RWMutex
	handlers map[uint16]Handler       // guarded by mu
	conns    map[*serverConn]struct{} // guarded by mu
	closed   bool                     // guarded by mu

	closeOnce sync.Once
	closeErr  error
}

// NewServer starts serving the connections l accepts, which must be
// *transport.Conn; others are closed. It starts one goroutine accepting,
// and per connection one reading frames and at most cfg.MaxConcurrent
// running handlers; Close stops and waits for all of them. Register
// handlers with Handle before peers send requests: an op without a handler
// is answered with ErrUnknownOp.
func NewServer(l net.Listener, cfg ServerConfig) *Server {
	cfg.setDefaults()
	s := &Server{l: l, cfg: cfg, handlers: make(map[uint16]Handler), conns: make(map[*serverConn]struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Go(s.acceptLoop)
	return s
}

// Handle registers h for requests of op, replacing any handler before. Ops
// below FirstOp are the protocol's: Handle panics on one.
func (s *Server) Handle(op uint16, h Handler) {
	if op < FirstOp {
		panic(fmt.Sprintf("remote: Handle(%d): ops below %d are reserved", op, FirstOp))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers[op] = h
}

func (s *Server) handler(op uint16) Handler {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.handlers[op]
}

// MaxFrameBytes is the largest frame the server reads or writes.
func (s *Server) MaxFrameBytes() int { return s.cfg.MaxFrameBytes }

func (s *Server) acceptLoop() {
	transport.AcceptEach(s.ctx, s.l, s.cfg.Logger, "remote: accept", func(c net.Conn) bool {
		tc, ok := c.(*transport.Conn)
		if !ok {
			s.cfg.Logger.Warn("remote: refused a connection that is not a transport.Conn", "remote", c.RemoteAddr())
			c.Close()
			return true
		}
		sc := s.newConn(tc)
		if !s.track(sc) {
			tc.Close()
			return false
		}
		s.wg.Go(sc.serve)
		return true
	})
}

func (s *Server) track(sc *serverConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[sc] = struct{}{}
	return true
}

func (s *Server) untrack(sc *serverConn) {
	s.mu.Lock()
	delete(s.conns, sc)
	s.mu.Unlock()
}

// Close stops accepting, closes the listener and every connection,
// cancelling their handlers' ctx, and waits for every goroutine of the
// server, handlers included. Safe to call more than once; it returns the
// listener's Close error.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.cancel()
		s.closeErr = s.l.Close()
		for sc := range s.conns {
			sc.c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s.closeErr
}

// serverConn is one accepted connection.
type serverConn struct {
	s      *Server
	c      *transport.Conn
	peer   string
	ctx    context.Context // cancelled when the connection ends
	cancel context.CancelFunc
	slots  chan struct{} // one per running handler
	wg     sync.WaitGroup
	// lastWrite is when a reply was last written, in unix ns, for the idle
	// deadline.
	lastWrite atomic.Int64

	mu       sync.Mutex
	inflight int                 // guarded by mu: bytes of requests and replies held
	room     chan struct{}       // guarded by mu: closed when inflight drops; nil unless the reader waits
	running  map[uint64]*request // guarded by mu: by request id

	// Replies are combined: a handler whose reply is ready while another
	// handler writes appends it to wbuf and returns, and the writing
	// handler writes it next, with all the others that came meanwhile, in
	// one write. No reply waits for others to come: the writer writes what
	// is there as soon as its write before ended.
	wmu     sync.Mutex
	wbuf    []byte    // guarded by wmu: reply frames not yet written
	wbig    []bigPart // guarded by wmu: their payloads not copied into wbuf
	wcost   int       // guarded by wmu: what they count in inflight
	wspare  []byte    // guarded by wmu: the buffer of the write before, for reuse
	wbspare []bigPart // guarded by wmu: likewise
	writing bool      // guarded by wmu: a handler is writing wbuf's frames
	wfailed bool      // guarded by wmu: a write failed; the connection is closed
}

// bigPart is a reply payload larger than copyMax, written from where the
// handler left it after its header, wbuf[:at].
type bigPart struct {
	at int
	p  []byte
}

// copyMax is the largest payload copied into a connection's write buffer:
// a larger one, a Fetch reply, is written from the handler's buffer after
// its header, in the same write, one writev on TCP.
const copyMax = 32 << 10

// frameCost is what a frame counts against MaxInflightBytes beside its
// payload: its header and the bookkeeping of its handler.
const frameCost = 4 + wire.FrameHeaderSize + 256

// yieldBelow: a writer with fewer bytes than this to write, and other calls
// or handlers in flight, lets the goroutines that are ready run first, with
// runtime.Gosched and no timer, as they are often calls or handlers about to
// add a frame to its write: the replies of one group commit, the next
// requests of the callers those replies woke. It never waits for one that is
// not ready: there is no Nagle-like delay. Alone, it does not yield: a yield
// is a trip through the scheduler for nothing.
const yieldBelow = 16 << 10

// wbufKeep is the largest write buffer a connection keeps between replies.
const wbufKeep = 64 << 10

func (s *Server) newConn(c *transport.Conn) *serverConn {
	sc := &serverConn{
		s:       s,
		c:       c,
		peer:    c.PeerID(),
		slots:   make(chan struct{}, s.cfg.MaxConcurrent),
		running: make(map[uint64]*request),
	}
	sc.ctx, sc.cancel = context.WithCancel(s.ctx)
	sc.lastWrite.Store(time.Now().UnixNano())
	return sc
}

// serve reads requests until the connection fails, then cancels its
// handlers and waits for them.
func (sc *serverConn) serve() {
	defer sc.s.untrack(sc)
	defer sc.wg.Wait()
	defer sc.c.Close()
	defer sc.cancel()
	cfg := &sc.s.cfg
	dr := &deadlineReader{c: sc.c, idle: cfg.IdleTimeout, frame: cfg.ReadTimeout, busy: sc.busy}
	fr := wire.NewFrameReader(dr, cfg.MaxFrameBytes)
	waitedSlot := false
	for {
		waited, ok := sc.waitRoom()
		if !ok {
			return
		}
		if waited || waitedSlot {
			dr.resume()
		}
		f, err := fr.ReadFrame()
		if err != nil {
			if sc.ctx.Err() == nil && !isEOF(err) {
				cfg.Logger.Warn("remote: connection closed", "peer", sc.peer, "err", err)
			}
			return
		}
		if f.Op == opCancel {
			sc.cancelRequest(f.ReqID)
			continue
		}
		if f.Op == opPing { // answered here: no handler runs for it
			// Counted like a request's reply, so that a peer pinging
			// without reading is held back by waitRoom, not by a write
			// buffer that grows until WriteTimeout.
			sc.mu.Lock()
			sc.inflight += frameCost
			sc.mu.Unlock()
			sc.send(wire.Frame{ReqID: f.ReqID, Op: opReply}, frameCost)
			continue
		}
		waitedSlot = false
		select {
		case sc.slots <- struct{}{}:
		default:
			waitedSlot = true
			select {
			case sc.slots <- struct{}{}:
			case <-sc.ctx.Done():
				return
			}
		}
		req := bytes.Clone(f.Payload)
		cost := frameCost + len(req)
		hctx, cancel := context.WithCancel(sc.ctx)
		r := &request{id: f.ReqID, op: f.Op, cancel: cancel, cost: cost}
		sc.mu.Lock()
		sc.inflight += cost
		if _, dup := sc.running[r.id]; !dup { // a peer's mistake: not cancellable
			sc.running[r.id] = r
		}
		sc.mu.Unlock()
		sc.wg.Go(func() {
			defer func() { <-sc.slots }()
			sc.handle(hctx, r, req)
		})
	}
}

func isEOF(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF)
}

// request is a request whose handler runs.
type request struct {
	id     uint64
	op     uint16
	cancel context.CancelFunc
	cost   int // counted in inflight
}

// waitRoom waits until inflight is under the limit; waited reports that it
// had to, ok false that the connection ended.
func (sc *serverConn) waitRoom() (waited, ok bool) {
	for {
		sc.mu.Lock()
		if sc.inflight < sc.s.cfg.MaxInflightBytes {
			sc.mu.Unlock()
			return waited, true
		}
		room := sc.room
		if room == nil {
			room = make(chan struct{})
			sc.room = room
		}
		sc.mu.Unlock()
		waited = true
		select {
		case <-room:
		case <-sc.ctx.Done():
			return waited, false
		}
	}
}

// release returns n bytes of inflight and wakes the reader if it waits.
func (sc *serverConn) release(n int) {
	sc.mu.Lock()
	sc.inflight -= n
	if sc.room != nil {
		close(sc.room)
		sc.room = nil
	}
	sc.mu.Unlock()
}

// busy reports that the connection is not idle: a request is in flight or
// a reply was written within the idle timeout.
func (sc *serverConn) busy() bool {
	sc.mu.Lock()
	n := len(sc.running)
	sc.mu.Unlock()
	return n > 0 || time.Since(time.Unix(0, sc.lastWrite.Load())) < sc.s.cfg.IdleTimeout
}

func (sc *serverConn) cancelRequest(id uint64) {
	sc.mu.Lock()
	r := sc.running[id]
	sc.mu.Unlock()
	if r != nil {
		r.cancel()
	}
}

// handle runs the handler of one request and writes its reply.
func (sc *serverConn) handle(ctx context.Context, r *request, req []byte) {
	resp, err := sc.call(ctx, r.op, req)
	r.cancel()
	id, op := r.id, r.op
	sc.mu.Lock()
	if sc.running[id] == r {
		delete(sc.running, id)
	}
	sc.inflight += len(resp)
	sc.mu.Unlock()
	cost := r.cost + len(resp) // released once the reply is written
	if sc.ctx.Err() != nil {
		// The connection or the server is closing: a handler that ended
		// because of it has no answer, and the caller learns that the
		// outcome is unknown, with ErrUnavailable, rather than a ctx error
		// of ours.
		sc.release(cost)
		return
	}
	f := wire.Frame{ReqID: id, Op: opReply, Payload: resp}
	if err != nil {
		f = wire.Frame{ReqID: id, Op: opError, Payload: appendError(nil, err)}
	} else if wire.FrameHeaderSize+len(resp) > sc.s.cfg.MaxFrameBytes {
		err := fmt.Errorf("%w: reply of %d bytes to op %d, limit %d", wire.ErrFrameTooLarge, len(resp), op, sc.s.cfg.MaxFrameBytes)
		f = wire.Frame{ReqID: id, Op: opError, Payload: appendError(nil, err)}
	}
	sc.send(f, cost)
}

// call runs op's handler, containing its panic: one request must not stop
// the node.
func (sc *serverConn) call(ctx context.Context, op uint16, req []byte) (resp []byte, err error) {
	h := sc.s.handler(op)
	if h == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownOp, op)
	}
	defer func() {
		if r := recover(); r != nil {
			sc.s.cfg.Logger.Error("remote: handler panicked", "op", op, "peer", sc.peer, "panic", r)
			resp, err = nil, fmt.Errorf("%w: handler of op %d panicked", ErrRemote, op)
		}
	}()
	return h(ctx, sc.peer, req)
}

// send queues f, whose handler counted cost in inflight, and writes it
// unless another handler is writing: then that one writes it, in its next
// write. cost is released when f is written, or dropped when the
// connection failed. A failure closes the connection.
func (sc *serverConn) send(f wire.Frame, cost int) {
	sc.wmu.Lock()
	if sc.wfailed {
		sc.wmu.Unlock()
		sc.release(cost)
		return
	}
	var err error
	if len(f.Payload) > copyMax {
		if sc.wbuf, err = wire.AppendFrameHeader(sc.wbuf, f, sc.s.cfg.MaxFrameBytes); err == nil {
			sc.wbig = append(sc.wbig, bigPart{at: len(sc.wbuf), p: f.Payload})
		}
	} else {
		sc.wbuf, err = wire.AppendFrame(sc.wbuf, f, sc.s.cfg.MaxFrameBytes)
	}
	if err != nil {
		sc.wmu.Unlock()
		sc.release(cost)
		sc.failWrite(err) // handle checked the size: cannot happen
		return
	}
	sc.wcost += cost
	if sc.writing {
		sc.wmu.Unlock()
		return
	}
	sc.writing = true
	if len(sc.wbuf) < yieldBelow && len(sc.wbig) == 0 && len(sc.slots) > 1 { // others run: see yieldBelow
		sc.wmu.Unlock()
		runtime.Gosched()
		sc.wmu.Lock()
	}
	for len(sc.wbuf) > 0 {
		b, big, n := sc.wbuf, sc.wbig, sc.wcost
		sc.wbuf, sc.wbig, sc.wcost = sc.wspare[:0], sc.wbspare[:0], 0
		sc.wspare, sc.wbspare = nil, nil
		sc.wmu.Unlock()
		err := sc.c.SetWriteDeadline(time.Now().Add(sc.s.cfg.WriteTimeout))
		if err == nil {
			err = sc.writeParts(b, big)
		}
		clear(big) // the payloads are the handlers' garbage now
		sc.release(n)
		if err != nil {
			sc.failWrite(err)
		} else {
			sc.lastWrite.Store(time.Now().UnixNano())
		}
		sc.wmu.Lock()
		if cap(b) <= wbufKeep {
			sc.wspare = b
		}
		sc.wbspare = big
		if err != nil {
			// The frames queued meanwhile are not written: their callers
			// learn that the connection broke.
			dropped := sc.wcost
			sc.wfailed, sc.writing = true, false
			sc.wbuf, sc.wcost = nil, 0
			sc.wmu.Unlock()
			sc.release(dropped)
			return
		}
	}
	sc.writing = false
	sc.wmu.Unlock()
}

// writeParts writes b with big's payloads in their places.
func (sc *serverConn) writeParts(b []byte, big []bigPart) error {
	if len(big) == 0 {
		_, err := sc.c.Write(b)
		return err
	}
	bufs := make(net.Buffers, 0, 2*len(big)+1)
	at := 0
	for _, p := range big {
		bufs = append(bufs, b[at:p.at], p.p)
		at = p.at
	}
	if at < len(b) {
		bufs = append(bufs, b[at:])
	}
	// The embedded net.Conn, not the *transport.Conn: WriteTo writes a
	// TCP connection's parts with one writev only to a *net.TCPConn;
	// others, as TLS, get a Write per part.
	_, err := bufs.WriteTo(sc.c.Conn)
	return err
}

// failWrite closes the connection after a failed write.
func (sc *serverConn) failWrite(err error) {
	if sc.ctx.Err() == nil {
		sc.s.cfg.Logger.Warn("remote: write", "peer", sc.peer, "err", err)
	}
	sc.cancel()
	sc.c.Close()
}

// deadlineReader reads a connection under the server's deadlines: between
// frames the idle timeout, renewed while the connection is busy, and from
// a frame's first byte the read timeout for the whole frame. It follows the
// frame lengths in the bytes it passes, as what it reads ahead for the
// frame reader's buffer belongs to the next frame.
type deadlineReader struct {
	c           net.Conn
	idle, frame time.Duration
	busy        func() bool

	inFrame  bool
	hdr      [4]byte
	nh       int    // bytes of the current frame's length seen
	left     uint64 // bytes of the current frame after its length still to come
	deadline time.Time
}

func (r *deadlineReader) Read(b []byte) (int, error) {
	for {
		d := r.deadline
		if !r.inFrame {
			d = time.Now().Add(r.idle)
		}
		if err := r.c.SetReadDeadline(d); err != nil {
			return 0, err
		}
		n, err := r.c.Read(b)
		r.scan(b[:n])
		var ne net.Error
		if n == 0 && !r.inFrame && errors.As(err, &ne) && ne.Timeout() && r.busy() {
			continue
		}
		return n, err
	}
}

// scan follows the frames in p.
func (r *deadlineReader) scan(p []byte) {
	for len(p) > 0 {
		if !r.inFrame {
			r.inFrame, r.nh, r.left = true, 0, 0
			r.deadline = time.Now().Add(r.frame)
		}
		if r.nh < len(r.hdr) {
			k := copy(r.hdr[r.nh:], p)
			r.nh += k
			p = p[k:]
			if r.nh < len(r.hdr) {
				return
			}
			r.left = uint64(binary.BigEndian.Uint32(r.hdr[:]))
		}
		k := min(r.left, uint64(len(p)))
		r.left -= k
		p = p[k:]
		if r.left == 0 {
			r.inFrame = false
		}
	}
}

// resume gives the frame in progress a full read timeout again: the server
// did not read while it waited for room or a handler slot.
func (r *deadlineReader) resume() {
	if r.inFrame {
		r.deadline = time.Now().Add(r.frame)
	}
}
