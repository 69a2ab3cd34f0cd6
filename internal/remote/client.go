package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/wire"
)

// Defaults of ClientConfig's zero values.
const (
	DefaultDialTimeout        = 10 * time.Second
	DefaultClientWriteTimeout = 30 * time.Second
	DefaultProbeTimeout       = 10 * time.Second
)

// ClientConfig configures a Client. Zero values take the defaults.
type ClientConfig struct {
	// MaxFrameBytes is the largest request sent: the transport's
	// MaxFrameBytes, or wire.DefaultMaxFrameBytes if zero. A larger one
	// fails with wire.ErrFrameTooLarge before anything is written.
	MaxFrameBytes int
	// DialTimeout bounds one dial. Zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// WriteTimeout bounds the writing of one request,
	// DefaultClientWriteTimeout if zero; a write that does not finish breaks
	// the connection.
	WriteTimeout time.Duration
	// IdleTimeout closes the connection when no call was sent for that
	// long and none is pending, DefaultIdleTimeout/2 if zero. Keep it
	// below the server's IdleTimeout: when the server closes first, a
	// call sent at that moment fails with ErrUnavailable; when the client
	// does, no call is on the connection and the next one dials.
	IdleTimeout time.Duration
	// ProbeTimeout is how long a ping may go unanswered,
	// DefaultProbeTimeout if zero. A call that gives up, by its ctx, while
	// its request is in flight sends a ping; when nothing at all is read
	// from the connection for ProbeTimeout after the ping was written, the
	// peer is taken for gone (a paused process, a dropped link: no reset
	// ever comes) and the connection is closed, failing its calls with
	// ErrUnavailable, so that the next call dials anew. The server answers
	// a ping as soon as it reads it, but reads nothing while all its
	// handler slots are taken: keep ProbeTimeout above the longest a
	// handler runs, such as a Fetch's long poll (DefaultMaxWait).
	ProbeTimeout time.Duration
}

// Client calls one peer over one connection at a time: it dials on the
// first call, and again on the first call after the connection broke.
// Concurrent calls are pipelined on the connection, each frame carrying a
// request id; a writer goroutine writes them in turn, those ready together
// in one write, and a reader goroutine hands each reply to its call. Safe
// for concurrent use.
//
// Lock order: Client.mu, then clientConn.mu. A Client with no call for
// IdleTimeout closes its connection.
type Client struct {
	dial   func(ctx context.Context) (*transport.Conn, error)
	cfg    ClientConfig
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	nextID atomic.Uint64
	bufs   sync.Pool // *[]byte request frames
	chans  sync.Pool // chan reply, empty: a call's
	// replies holds *[]byte reply payloads given back by the internal
	// callers that decoded them, such as Partition; Call's caller keeps its
	// own.
	replies sync.Pool

	mu      sync.Mutex
	cn      *clientConn // guarded by mu: the connection, nil when none
	dialing *dialing    // guarded by mu: the dial in progress, nil when none
	closed  bool        // guarded by mu

	closeOnce sync.Once
}

// dialing is one dial; cn and err are set before done is closed.
type dialing struct {
	done chan struct{}
	cn   *clientConn
	err  error
}

// NewClient returns a client that connects with dial. dial gets a ctx that
// ends at cfg.DialTimeout or Close; it typically calls
// (*transport.Transport).Dial(ctx, addr, transport.ProtoRPC) and checks the
// peer's id. Nothing is dialed until the first Call. Close waits for the
// goroutines a connection starts: a dialer, a reader and a writer.
func NewClient(dial func(ctx context.Context) (*transport.Conn, error), cfg ClientConfig) *Client {
	if cfg.MaxFrameBytes <= 0 {
		cfg.MaxFrameBytes = wire.DefaultMaxFrameBytes
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultClientWriteTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout / 2
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	c := &Client{dial: dial, cfg: cfg}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// MaxFrameBytes is the largest frame the client sends.
func (c *Client) MaxFrameBytes() int { return c.cfg.MaxFrameBytes }

// Call sends req as op and returns the reply's payload, which the caller
// owns. It returns when the reply arrives; ctx's error as soon as ctx ends,
// dropping a reply that arrives later, asking the peer to cancel the
// handler and pinging it (ClientConfig.ProbeTimeout); an error wrapping
// ErrUnavailable when the connection cannot be dialed or breaks first: the
// request may then have run on the peer. A
// handler's error comes back as an *Error that errors.Is its sentinel. After
// Close, Call returns ErrClosed. req is copied into the request's frame
// before Call returns: the caller may reuse it then, however the call ended.
func (c *Client) Call(ctx context.Context, op uint16, req []byte) ([]byte, error) {
	resp, _, err := c.call(ctx, nil, op, req)
	return resp, err
}

// errStopped is what a call ended by its stop channel returns.
var errStopped = errors.New("remote: call stopped")

// call is Call, also ended with errStopped when stop is closed, as by ctx:
// a Partition passes its Close's channel instead of deriving, per call, a
// ctx and an AfterFunc that its Close cancels. resp is in *buf: a caller
// done with resp may give buf back with putReply.
func (c *Client) call(ctx context.Context, stop <-chan struct{}, op uint16, req []byte) (resp []byte, buf *[]byte, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if op < FirstOp {
		return nil, nil, fmt.Errorf("remote: call of reserved op %d", op)
	}
	if n := wire.FrameHeaderSize + len(req); n > c.cfg.MaxFrameBytes {
		return nil, nil, fmt.Errorf("%w: request of %d bytes, limit %d", wire.ErrFrameTooLarge, n, c.cfg.MaxFrameBytes)
	}
	for attempt := 0; ; attempt++ {
		cn, err := c.conn(ctx, stop)
		if err != nil {
			return nil, nil, err
		}
		id := c.nextID.Add(1)
		ch, _ := c.chans.Get().(chan reply)
		if ch == nil {
			ch = make(chan reply, 1)
		}
		if err := cn.register(id, ch); err != nil {
			c.chans.Put(ch)   // nobody else saw it
			if attempt == 0 { // broke before this call used it: nothing was sent
				continue
			}
			return nil, nil, err
		}
		return c.roundTrip(ctx, stop, cn, id, op, req, ch)
	}
}

// ended is the error of a call ended by ctx or stop.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return errStopped
}

func (c *Client) roundTrip(ctx context.Context, stop <-chan struct{}, cn *clientConn, id uint64, op uint16, req []byte, ch chan reply) ([]byte, *[]byte, error) {
	bp, _ := c.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	*bp, _ = wire.AppendFrame((*bp)[:0], wire.Frame{ReqID: id, Op: op, Payload: req}, c.cfg.MaxFrameBytes)
	select {
	case cn.reqs <- bp: // the writer owns *bp now, and puts it back
	case <-ctx.Done():
		cn.unregister(id)
		c.putBuf(bp)
		return nil, nil, ended(ctx)
	case <-stop:
		cn.unregister(id)
		c.putBuf(bp)
		return nil, nil, ended(ctx)
	case <-cn.done:
		c.putBuf(bp)
		return nil, nil, fmt.Errorf("%w: %w", ErrNotSent, cn.failure())
	}
	select {
	case r := <-ch:
		// Whoever sent r took ch out of pending first: nothing else
		// sends on it, and it is empty, so another call may use it.
		c.chans.Put(ch)
		return r.payload, r.buf, r.err
	case <-ctx.Done():
	case <-stop:
	}
	// ch is dropped, not pooled: the reader or fail may still send its
	// reply.
	if cn.unregister(id) {
		select {
		case cn.cancels <- id:
		default: // the writer is behind: the handler runs to its end
		}
		// No reply in time: the peer may be gone without a reset.
		select {
		case cn.pings <- struct{}{}:
		default: // a ping is on its way already
		}
	}
	return nil, nil, ended(ctx)
}

// replyKeep is the largest reply buffer given back to the pool: a Fetch
// reply's size, DefaultFlowBytes, and some.
const replyKeep = 2 << 20

// putReply gives back the buffer of a reply whose payload is no longer
// used; a nil buffer is ignored.
func (c *Client) putReply(bp *[]byte) {
	if bp != nil && cap(*bp) <= replyKeep {
		c.replies.Put(bp)
	}
}

func (c *Client) putBuf(bp *[]byte) {
	if cap(*bp) <= wbufKeep {
		c.bufs.Put(bp)
	}
}

// conn returns the connection, dialing it if there is none.
func (c *Client) conn(ctx context.Context, stop <-chan struct{}) (*clientConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if cn := c.cn; cn != nil {
		select {
		case <-cn.done: // broken, and fail has not cleared it yet
			c.cn = nil
		default:
			c.mu.Unlock()
			return cn, nil
		}
	}
	d := c.dialing
	if d == nil {
		d = &dialing{done: make(chan struct{})}
		c.dialing = d
		c.wg.Go(func() { c.dialOnce(d) })
	}
	c.mu.Unlock()
	select {
	case <-d.done:
		return d.cn, d.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-stop:
		return nil, ended(ctx)
	}
}

// dialOnce dials for d and, on success, starts the connection's reader and
// writer.
func (c *Client) dialOnce(d *dialing) {
	defer close(d.done)
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
	tc, err := c.dial(ctx)
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dialing = nil
	switch {
	case c.closed:
		if tc != nil {
			tc.Close()
		}
		d.err = ErrClosed
		return
	case err != nil:
		d.err = fmt.Errorf("%w: %w: dial: %w", ErrUnavailable, ErrNotSent, err)
		return
	}
	cn := &clientConn{
		c:       c,
		tc:      tc,
		reqs:    make(chan *[]byte),
		cancels: make(chan uint64, 64),
		pings:   make(chan struct{}, 1),
		done:    make(chan struct{}),
		pending: make(map[uint64]chan reply),
	}
	c.cn, d.cn = cn, cn
	c.wg.Go(cn.readLoop)
	c.wg.Go(cn.writeLoop)
}

// Close fails the calls in flight with an error wrapping ErrClosed and
// ErrUnavailable, closes the connection and waits for the client's
// goroutines. Safe to call more than once and concurrently with Call.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		cn := c.cn
		c.cn = nil
		c.mu.Unlock()
		c.cancel()
		if cn != nil {
			cn.fail(fmt.Errorf("%w: %w", ErrUnavailable, ErrClosed))
		}
		c.wg.Wait()
	})
	return nil
}

// reply is what a call receives.
type reply struct {
	payload []byte
	buf     *[]byte // payload's buffer, from Client.replies
	err     error
}

// clientConn is one connection of a Client.
type clientConn struct {
	c       *Client
	tc      *transport.Conn
	reqs    chan *[]byte  // frames for the writer
	cancels chan uint64   // ids of calls given up, for the writer
	pings   chan struct{} // a ping to send, for the writer
	done    chan struct{} // closed when the connection broke

	mu      sync.Mutex
	pending map[uint64]chan reply // guarded by mu; nil once broken
	err     error                 // guarded by mu: why it broke

	// The probe: the writer arms it once it wrote a ping, setting a read
	// deadline ProbeTimeout away; the reader disarms it, clearing the
	// deadline, when it reads any byte. A read that times out while it is
	// armed finds the peer silent. pmu is taken alone.
	pmu     sync.Mutex
	probing atomic.Bool // written under pmu; read without it by the reader
}

func (cn *clientConn) register(id uint64, ch chan reply) error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.pending == nil {
		return cn.err
	}
	cn.pending[id] = ch
	return nil
}

// unregister forgets call id; false if it was not pending, its reply or
// the failure having come.
func (cn *clientConn) unregister(id uint64) bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	_, ok := cn.pending[id]
	delete(cn.pending, id)
	return ok
}

func (cn *clientConn) failure() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err
}

// fail breaks the connection once: every pending call gets err, which
// wraps ErrUnavailable.
func (cn *clientConn) fail(err error) {
	// The client forgets cn first, so that no call takes it once the
	// calls on it have failed.
	cn.c.mu.Lock()
	if cn.c.cn == cn {
		cn.c.cn = nil
	}
	cn.c.mu.Unlock()
	cn.mu.Lock()
	if cn.pending == nil {
		cn.mu.Unlock()
		return
	}
	pending := cn.pending
	cn.pending, cn.err = nil, err
	close(cn.done)
	cn.mu.Unlock()
	cn.tc.Close()
	for _, ch := range pending {
		ch <- reply{err: err}
	}
}

func (cn *clientConn) readLoop() {
	fr := cn.frameReader()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			cn.fail(fmt.Errorf("%w: read: %w", ErrUnavailable, err))
			return
		}
		cn.mu.Lock()
		ch := cn.pending[f.ReqID]
		delete(cn.pending, f.ReqID)
		cn.mu.Unlock()
		if ch == nil {
			continue // its call gave up
		}
		bp, _ := cn.c.replies.Get().(*[]byte)
		ch <- frameReply(f, bp)
	}
}

// frameReader reads the connection's frames, under the transport's
// MaxFrameBytes, through a probeReader: a copy of cn.tc whose net.Conn is
// wrapped.
func (cn *clientConn) frameReader() *wire.FrameReader {
	tc := *cn.tc
	tc.Conn = probeReader{Conn: cn.tc.Conn, cn: cn}
	return tc.FrameReader()
}

// errSilent is why a connection whose peer did not answer a ping broke.
var errSilent = errors.New("no reply to a ping")

// probeReader reads a client connection for its reader, disarming the
// probe on every byte read and turning the probe's deadline into
// errSilent.
type probeReader struct {
	net.Conn
	cn *clientConn
}

func (r probeReader) Read(b []byte) (int, error) {
	for {
		n, err := r.Conn.Read(b)
		if n > 0 && r.cn.probing.Load() {
			r.cn.heard()
		}
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		if r.cn.silent() {
			return n, fmt.Errorf("%w within %v", errSilent, r.cn.c.cfg.ProbeTimeout)
		}
		if n > 0 { // a deadline passed as the bytes came: they answered
			return n, nil
		}
	}
}

// startProbe starts the probe, unless one runs, whose deadline stands:
// pings that follow it do not push it back.
func (cn *clientConn) startProbe() bool {
	cn.pmu.Lock()
	defer cn.pmu.Unlock()
	if cn.probing.Load() {
		return false
	}
	cn.probing.Store(true)
	return true
}

// arm sets the probe's deadline once its ping is written, unless a byte
// read since the writer set probing disarmed it: the reader must read a
// byte within ProbeTimeout.
func (cn *clientConn) arm() error {
	cn.pmu.Lock()
	defer cn.pmu.Unlock()
	if !cn.probing.Load() {
		return nil
	}
	return cn.tc.SetReadDeadline(time.Now().Add(cn.c.cfg.ProbeTimeout))
}

// heard disarms the probe; the reader calls it, between its reads.
func (cn *clientConn) heard() {
	cn.pmu.Lock()
	defer cn.pmu.Unlock()
	if cn.probing.Load() {
		cn.probing.Store(false)
		cn.tc.SetReadDeadline(time.Time{}) // an error shows in the next read
	}
}

// silent reports that a read deadline passed with the probe armed: only
// the probe sets one, and the byte that disarms it also clears it.
func (cn *clientConn) silent() bool {
	cn.pmu.Lock()
	defer cn.pmu.Unlock()
	return cn.probing.Load()
}

// frameReply turns a reply frame into what its call returns; a payload is
// copied into *bp, or a new buffer if bp is nil, which the reply carries.
func frameReply(f wire.Frame, bp *[]byte) reply {
	switch f.Op {
	case opReply:
		if bp == nil {
			bp = new([]byte)
		}
		*bp = append((*bp)[:0], f.Payload...)
		return reply{payload: *bp, buf: bp}
	case opError:
		e, err := decodeError(f.Payload)
		if err != nil {
			return reply{err: err}
		}
		return reply{err: e}
	}
	return reply{err: fmt.Errorf("%w: reply with op %d", ErrProtocol, f.Op)}
}

// closeIdle closes cn if no call is pending, atomically with respect to
// register: a call registering after it fails and dials anew, nothing
// sent.
func (cn *clientConn) closeIdle() bool {
	cn.c.mu.Lock()
	defer cn.c.mu.Unlock()
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.pending == nil || len(cn.pending) > 0 {
		return false
	}
	if cn.c.cn == cn {
		cn.c.cn = nil
	}
	cn.pending, cn.err = nil, fmt.Errorf("%w: connection closed idle", ErrUnavailable)
	close(cn.done)
	cn.tc.Close()
	return true
}

func (cn *clientConn) writeLoop() {
	var wbuf []byte
	idle := time.NewTimer(cn.c.cfg.IdleTimeout)
	defer idle.Stop()
	for {
		var err error
		select {
		case <-idle.C:
			if cn.closeIdle() {
				return
			}
			idle.Reset(cn.c.cfg.IdleTimeout)
		case bp := <-cn.reqs:
			idle.Reset(cn.c.cfg.IdleTimeout)
			wbuf = cn.gather(append(wbuf[:0], *bp...))
			cn.c.putBuf(bp)
			err = cn.write(wbuf)
		case id := <-cn.cancels:
			wbuf = cn.gather(cn.appendCancel(wbuf[:0], id))
			err = cn.write(wbuf)
		case <-cn.pings:
			wbuf = cn.gather(cn.appendPing(wbuf[:0]))
			// Armed before the write, the deadline set after it: the
			// answer may be read before write returns, and disarms.
			started := cn.startProbe()
			if err = cn.write(wbuf); err == nil && started {
				err = cn.arm()
			}
		case <-cn.done:
			return
		}
		if cap(wbuf) > wbufKeep {
			wbuf = nil
		}
		if err != nil {
			cn.fail(fmt.Errorf("%w: write: %w", ErrUnavailable, err))
			return
		}
	}
}

// gather appends to b the requests and cancels that are ready, up to
// wbufKeep bytes, so that the calls that came while the writer wrote go
// out in one write. It waits for none: a call is never held back for
// others.
func (cn *clientConn) gather(b []byte) []byte {
	if len(b) < yieldBelow && cn.others() {
		runtime.Gosched()
	}
	for len(b) < wbufKeep {
		select {
		case bp := <-cn.reqs:
			b = append(b, *bp...)
			cn.c.putBuf(bp)
		case id := <-cn.cancels:
			b = cn.appendCancel(b, id)
		default:
			return b
		}
	}
	return b
}

// others reports that more than one call is pending: the writer's yield
// lets the others' callers, whose replies came, send their next request
// in its write. A lone call has nobody to wait for, and a yield costs a
// trip through the scheduler.
func (cn *clientConn) others() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return len(cn.pending) > 1
}

func (cn *clientConn) appendCancel(b []byte, id uint64) []byte {
	b, _ = wire.AppendFrame(b, wire.Frame{ReqID: id, Op: opCancel}, cn.c.cfg.MaxFrameBytes)
	return b
}

// appendPing appends a ping, whose id no call has: the reader drops its
// reply.
func (cn *clientConn) appendPing(b []byte) []byte {
	b, _ = wire.AppendFrame(b, wire.Frame{ReqID: cn.c.nextID.Add(1), Op: opPing}, cn.c.cfg.MaxFrameBytes)
	return b
}

func (cn *clientConn) write(b []byte) error {
	if err := cn.tc.SetWriteDeadline(time.Now().Add(cn.c.cfg.WriteTimeout)); err != nil {
		return err
	}
	_, err := cn.tc.Write(b)
	return err
}
