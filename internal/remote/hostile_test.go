package remote

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/testlog"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/wire"
)

// Hostile peers know the cluster secret (they pass the transport's
// handshake) and then write raw bytes.

func rawFrame(t testing.TB, id uint64, op uint16, payload []byte) []byte {
	t.Helper()
	b, err := wire.AppendFrame(nil, wire.Frame{ReqID: id, Op: op, Payload: payload}, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// closedByServer waits until the server closes c: a read returns EOF or a
// reset, not the test's own deadline.
func closedByServer(t testing.TB, c *transport.Conn) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(patience)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the server kept the connection open for %v", patience)
		}
		return
	}
}

// readReply reads one frame from c with fr, its reader.
func readReply(t testing.TB, c *transport.Conn, fr *wire.FrameReader) wire.Frame {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(patience)); err != nil {
		t.Fatal(err)
	}
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatalf("read reply: %v", err)
	}
	f.Payload = append([]byte(nil), f.Payload...)
	return f
}

func (n *node) conns() int {
	n.mu.Lock()
	s := n.srv
	n.mu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.conns)
}

// stillServes checks that the server answers a well-behaved client.
func (r *rpcNode) stillServes(t testing.TB) {
	t.Helper()
	if resp, err := r.client.Call(ctxT(t), opEcho, []byte("ok")); err != nil || string(resp) != "ok" {
		t.Fatalf("Call after the attack = %q, %v", resp, err)
	}
}

// hostileAllocSlack is what a refused connection may allocate beyond one
// frame: the frame reader's 4 KiB buffer, the connection's goroutine and
// records, the log line, the test's own reads.
const hostileAllocSlack = 256 << 10

// refusedWith waits for the server's log line about the connection it
// closed, naming want in its error.
func refusedWith(t testing.TB, logs *testlog.Lines, want string) {
	t.Helper()
	waitFor(t, "the log line of the closed connection", func() bool {
		return len(logs.Matching("remote: connection closed", "peer=client", want)) > 0
	})
	if n := len(logs.Matching("remote: connection closed")); n != 1 {
		t.Fatalf("%d log lines for one connection:\n%s", n, logs.String())
	}
}

// TestServer_Hostile: each hostile input from an authenticated peer gets
// its connection closed with one log line naming why, allocates at most
// MaxFrameBytes and a small constant (runtime.MemStats' TotalAlloc over the
// attack), and the server goes on serving.
func TestServer_Hostile(t *testing.T) {
	leakCheck(t)
	const maxFrame = 1 << 20
	logs := &testlog.Lines{}
	r := newRPCNode(t, ServerConfig{MaxFrameBytes: maxFrame, ReadTimeout: 500 * time.Millisecond, Logger: slog.New(logs)},
		ClientConfig{MaxFrameBytes: maxFrame})
	r.stillServes(t) // the client's connection is the one that stays
	write := func(t testing.TB, c *transport.Conn, b []byte) {
		t.Helper()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	// attack runs fn on a fresh connection, checks the refusal's log
	// line and what the process allocated meanwhile.
	attack := func(t *testing.T, want string, fn func(c *transport.Conn)) {
		t.Helper()
		c := r.dial()
		logs.Reset()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		fn(c)
		refusedWith(t, logs, want)
		runtime.ReadMemStats(&after)
		got := after.TotalAlloc - before.TotalAlloc
		t.Logf("allocated %d KiB; logged: %s", got>>10, logs.Matching("remote: connection closed")[0])
		if got > maxFrame+hostileAllocSlack {
			t.Fatalf("allocated %d bytes, limit MaxFrameBytes+%d", got, hostileAllocSlack)
		}
		r.stillServes(t)
	}
	random := make([]byte, 64<<10)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(rnd.Uint32())
	}
	var prefixes []byte
	for _, p := range [][]byte{{0xdd, 0xff, 0xff, 0xff, 0xff}, {0xdf, 0xff, 0xff, 0xff, 0xff}, {0xdb, 0xff, 0xff, 0xff, 0xff}, {0xc6, 0xff, 0xff, 0xff, 0xff}} {
		for op := OpApply; op <= lastPartOp; op++ {
			prefixes = append(prefixes, rawFrame(t, 1, op, p)...)
		}
	}
	prefixes = append(prefixes, 0xdd, 0xff, 0xff, 0xff, 0xff) // and as a frame length
	for _, tc := range []struct {
		name string
		in   []byte
		want string // in the log line
	}{
		{"OversizedLength", []byte{0xff, 0xff, 0xff, 0xff, 0, 0}, "frame too large"},
		{"JustOverLimit", binary.BigEndian.AppendUint32(nil, maxFrame+1), "frame too large"},
		{"ShortLength", []byte{0, 0, 0, 3, 1, 2, 3}, "shorter than its header"},
		{"Random", random, "frame too large"},
		{"MsgpackPrefixes", prefixes, "frame too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attack(t, tc.want, func(c *transport.Conn) {
				write(t, c, tc.in)
				closedByServer(t, c)
			})
		})
	}
	t.Run("Truncated", func(t *testing.T) {
		attack(t, "unexpected EOF", func(c *transport.Conn) {
			write(t, c, rawFrame(t, 1, opEcho, make([]byte, 100))[:20])
			c.Close()
			waitFor(t, "the server to drop the connection", func() bool { return r.conns() == 1 })
		})
	})
	t.Run("TruncatedAndStalled", func(t *testing.T) {
		attack(t, "timeout", func(c *transport.Conn) {
			write(t, c, rawFrame(t, 1, opEcho, make([]byte, 100))[:20])
			closedByServer(t, c) // the read timeout
		})
	})
	t.Run("ByteASecond", func(t *testing.T) {
		// One byte every 50 ms of a 200-byte frame would take 10 s: the
		// read timeout (500 ms from the first byte) cuts it.
		attack(t, "timeout", func(c *transport.Conn) {
			frame := rawFrame(t, 1, opEcho, make([]byte, 190))
			done := make(chan int, 1)
			go func() {
				n := 0
				for ; n < len(frame); n++ {
					if _, err := c.Write(frame[n : n+1]); err != nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				done <- n
			}()
			closedByServer(t, c)
			c.Close()
			if n := <-done; n == len(frame) {
				t.Fatal("the whole frame was sent before the server closed")
			}
		})
	})
	t.Run("UnknownOp", func(t *testing.T) {
		c := r.dial()
		fr := c.FrameReader()
		for _, op := range []uint16{999, opReply, opError, FirstOp - 1} {
			write(t, c, rawFrame(t, 7, op, []byte("x")))
			f := readReply(t, c, fr)
			e, err := decodeError(f.Payload)
			if f.ReqID != 7 || f.Op != opError || err != nil || !errors.Is(e, ErrUnknownOp) {
				t.Fatalf("reply to op %d: %+v (%v, %v), want ErrUnknownOp", op, f, e, err)
			}
		}
		write(t, c, rawFrame(t, 8, opEcho, []byte("y")))
		if f := readReply(t, c, fr); f.ReqID != 8 || f.Op != opReply || string(f.Payload) != "y" {
			t.Fatalf("echo after the unknown ops: %+v", f)
		}
		// A cancel of nothing, and a request id used twice, are harmless.
		write(t, c, rawFrame(t, 12345, opCancel, nil))
		write(t, c, append(rawFrame(t, 9, opEcho, []byte("a")), rawFrame(t, 9, opEcho, []byte("b"))...))
		got := string(readReply(t, c, fr).Payload) + string(readReply(t, c, fr).Payload)
		if got != "ab" && got != "ba" {
			t.Fatalf("replies to a repeated id: %q", got)
		}
	})
	r.stillServes(t)
}

// TestServer_IdleTimeout: a connection without requests is closed; one with
// a request in flight longer than the timeout is not.
func TestServer_IdleTimeout(t *testing.T) {
	leakCheck(t)
	r := newRPCNode(t, ServerConfig{IdleTimeout: 300 * time.Millisecond}, ClientConfig{})
	closedByServer(t, r.dial())
	errc := make(chan error, 1)
	go func() { _, err := r.client.Call(ctxT(t), opGate, u32(0)); errc <- err }()
	waitFor(t, "the request at its handler", func() bool { return r.arrived.Load() == 1 })
	time.Sleep(time.Second) // three idle timeouts
	close(r.gates[0])
	if err := <-errc; err != nil {
		t.Fatalf("a call longer than the idle timeout: %v", err)
	}
	if d := r.dialCount(); d != 1 {
		t.Fatalf("%d dials: the busy connection was closed", d)
	}
	// Idle again, the client's connection is closed, and redialed. (A call
	// racing with the close fails with ErrUnavailable: wait for the client
	// to see it.)
	waitFor(t, "the idle connection to close", func() bool {
		r.client.mu.Lock()
		defer r.client.mu.Unlock()
		return r.conns() == 0 && r.client.cn == nil
	})
	r.stillServes(t)
	if d := r.dialCount(); d != 2 {
		t.Fatalf("%d dials, want 2", d)
	}
}

// TestServer_Flood: peers writing requests as fast as they can, whose
// handlers never finish, make the server hold at most MaxConcurrent
// handlers and about MaxInflightBytes per connection: it stops reading.
func TestServer_Flood(t *testing.T) {
	leakCheck(t)
	const (
		frame   = 1 << 20
		conns   = 4
		maxConc = 4
	)
	r := newRPCNode(t, ServerConfig{MaxFrameBytes: frame, MaxInflightBytes: frame, MaxConcurrent: maxConc}, ClientConfig{MaxFrameBytes: frame})
	r.stillServes(t)
	req := rawFrame(t, 1, opGate, make([]byte, frame/4)) // gate 0, never opened
	var cs []*transport.Conn
	for range conns {
		cs = append(cs, r.dial())
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	written := make([]int, conns)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for written[i] < 1<<30 { // until the socket is full
				if err := c.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
					return
				}
				n, err := c.Write(req)
				written[i] += n
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait() // every writer blocked for a second: the server stopped reading
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := r.arrived.Load(); got > conns*maxConc {
		t.Fatalf("%d handlers started, want at most %d", got, conns*maxConc)
	}
	total := 0
	for _, n := range written {
		total += n
	}
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("flood of %d MiB: heap grew %d KiB, %d handlers", total>>20, growth>>10, r.arrived.Load())
	// Per connection: the frame reader's buffer, MaxInflightBytes and one
	// frame over it.
	if limit := int64(conns * 4 * frame); growth > limit {
		t.Fatalf("heap grew by %d bytes under the flood, limit %d", growth, limit)
	}
	r.stillServes(t)
}

// TestServer_ReadTimeout_NotWhileWaiting: the time the server spends not
// reading (all handler slots taken) does not count against a frame that
// had begun to arrive.
func TestServer_ReadTimeout_NotWhileWaiting(t *testing.T) {
	leakCheck(t)
	r := newRPCNode(t, ServerConfig{MaxConcurrent: 1, ReadTimeout: time.Second}, ClientConfig{})
	c := r.dial()
	fr := c.FrameReader()
	f3 := rawFrame(t, 3, opEcho, []byte("third"))
	in := append(rawFrame(t, 1, opGate, u32(0)), rawFrame(t, 2, opEcho, []byte("second"))...)
	if _, err := c.Write(append(in, f3[:5]...)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first request at its handler", func() bool { return r.arrived.Load() == 1 })
	time.Sleep(2500 * time.Millisecond) // the second waits for the slot
	close(r.gates[0])
	for _, want := range []uint64{1, 2} {
		if f := readReply(t, c, fr); f.ReqID != want || f.Op != opReply {
			t.Fatalf("reply %+v, want one to %d", f, want)
		}
	}
	if _, err := c.Write(f3[5:]); err != nil {
		t.Fatal(err)
	}
	if f := readReply(t, c, fr); f.ReqID != 3 || string(f.Payload) != "third" {
		t.Fatalf("reply %+v, want the third", f)
	}
}
