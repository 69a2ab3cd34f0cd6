package remote

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/store"
)

const (
	opEcho  = 100 // replies with the request
	opGate  = 101 // waits for its gate (the request's uint32), then echoes
	opBlock = 102 // waits for its ctx, then reports it on blocked
	opFail  = 103 // fails with the error the request names
	opPanic = 104
	opBig   = 105 // replies with as many bytes as the request's uint32
)

// leakCheck makes t fail if goroutines outlive it (after its cleanups).
func leakCheck(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// rpcNode is a node serving the test ops.
type rpcNode struct {
	*node
	gates   []chan struct{}
	arrived atomic.Int32
	blocked chan error // a handler of opBlock's ctx error
}

func newRPCNode(t *testing.T, scfg ServerConfig, ccfg ClientConfig) *rpcNode {
	r := &rpcNode{blocked: make(chan error, 100)}
	for range 64 {
		r.gates = append(r.gates, make(chan struct{}))
	}
	r.node = newNode(t, scfg, ccfg, func(s *Server) {
		s.Handle(opEcho, func(_ context.Context, _ string, req []byte) ([]byte, error) { return req, nil })
		s.Handle(opGate, func(ctx context.Context, _ string, req []byte) ([]byte, error) {
			r.arrived.Add(1)
			select {
			case <-r.gates[binary.BigEndian.Uint32(req)]:
				return req, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		s.Handle(opBlock, func(ctx context.Context, _ string, _ []byte) ([]byte, error) {
			r.arrived.Add(1)
			<-ctx.Done()
			r.blocked <- ctx.Err()
			return nil, ctx.Err()
		})
		s.Handle(opFail, func(_ context.Context, _ string, req []byte) ([]byte, error) {
			return nil, fmt.Errorf("handler says: %w", sentinels[string(req)])
		})
		s.Handle(opPanic, func(context.Context, string, []byte) ([]byte, error) { panic("test panic") })
		s.Handle(opBig, func(_ context.Context, _ string, req []byte) ([]byte, error) {
			return make([]byte, binary.BigEndian.Uint32(req)), nil
		})
	})
	return r
}

var sentinels = map[string]error{
	"closed": store.ErrClosed, "stale": store.ErrStaleGeneration, "decided": store.ErrDecided,
	"bad": store.ErrBadCommand, "large": store.ErrTooLarge, "corrupt": store.ErrCorrupt,
	"failed": store.ErrFailed, "wal": store.ErrWALFailed, "format": store.ErrFormat,
	"canceled": context.Canceled, "deadline": context.DeadlineExceeded,
	"frame": wire.ErrFrameTooLarge, "user": errNoPartition, "plain": errors.New("plain"),
}

func u32(i int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(i)) }

func (r *rpcNode) dialCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dials
}

// TestClient_Call_Pipelined: concurrent calls share one connection, and
// replies that come in the reverse order reach their own calls.
func TestClient_Call_Pipelined(t *testing.T) {
	leakCheck(t)
	const n = 32
	r := newRPCNode(t, ServerConfig{MaxConcurrent: n}, ClientConfig{})
	ctx := ctxT(t)
	done := make([]chan []byte, n)
	for i := range n {
		done[i] = make(chan []byte, 1)
		go func() {
			resp, err := r.client.Call(ctx, opGate, u32(i))
			if err != nil {
				t.Errorf("call %d: %v", i, err)
			}
			done[i] <- resp
		}()
	}
	waitFor(t, "every request at its handler", func() bool { return r.arrived.Load() == n })
	for i := n - 1; i >= 0; i-- {
		close(r.gates[i])
		select {
		case resp := <-done[i]:
			if !bytes.Equal(resp, u32(i)) {
				t.Fatalf("call %d got %x", i, resp)
			}
		case <-time.After(patience):
			t.Fatalf("call %d did not return", i)
		}
	}
	if d := r.dialCount(); d != 1 {
		t.Fatalf("%d dials, want 1", d)
	}
}

// TestClient_Call_Many: many concurrent calls of varied sizes each get
// their own payload back.
func TestClient_Call_Many(t *testing.T) {
	leakCheck(t)
	r := newRPCNode(t, ServerConfig{}, ClientConfig{})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				req := bytes.Repeat([]byte{byte(g), byte(i)}, (g*50+i)*37%5000)
				resp, err := r.client.Call(ctx, opEcho, req)
				if err != nil || !bytes.Equal(resp, req) {
					t.Errorf("call %d/%d: %d bytes, %v; want %d bytes", g, i, len(resp), err, len(req))
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestClient_Call_Errors: a handler's error arrives as its sentinel with
// its message, an unknown op or a panic as an error, and the connection
// goes on.
func TestClient_Call_Errors(t *testing.T) {
	leakCheck(t)
	r := newRPCNode(t, ServerConfig{}, ClientConfig{})
	ctx := ctxT(t)
	for name, want := range sentinels {
		if name == "plain" {
			want = ErrRemote // no code: its message only
		}
		t.Run(name, func(t *testing.T) {
			_, err := r.client.Call(ctx, opFail, []byte(name))
			if !errors.Is(err, want) || !strings.HasPrefix(err.Error(), "handler says: ") {
				t.Fatalf("Call = %v, want %v with the handler's message", err, want)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Call = %T, want *Error", err)
			}
		})
	}
	t.Run("UnknownOp", func(t *testing.T) {
		if _, err := r.client.Call(ctx, 999, nil); !errors.Is(err, ErrUnknownOp) {
			t.Fatalf("Call(999) = %v, want ErrUnknownOp", err)
		}
	})
	t.Run("Panic", func(t *testing.T) {
		if _, err := r.client.Call(ctx, opPanic, nil); !errors.Is(err, ErrRemote) {
			t.Fatalf("Call = %v, want ErrRemote", err)
		}
	})
	t.Run("ReservedOp", func(t *testing.T) {
		if _, err := r.client.Call(ctx, opCancel, nil); err == nil {
			t.Fatal("call of a reserved op succeeded")
		}
	})
	t.Run("RequestTooLarge", func(t *testing.T) {
		if _, err := r.client.Call(ctx, opEcho, make([]byte, wire.DefaultMaxFrameBytes)); !errors.Is(err, wire.ErrFrameTooLarge) {
			t.Fatalf("Call = %v, want ErrFrameTooLarge", err)
		}
	})
	t.Run("ReplyTooLarge", func(t *testing.T) {
		if _, err := r.client.Call(ctx, opBig, u32(wire.DefaultMaxFrameBytes)); !errors.Is(err, wire.ErrFrameTooLarge) {
			t.Fatalf("Call = %v, want ErrFrameTooLarge", err)
		}
		resp, err := r.client.Call(ctx, opBig, u32(wire.DefaultMaxFrameBytes-wire.FrameHeaderSize))
		if err != nil || len(resp) != wire.DefaultMaxFrameBytes-wire.FrameHeaderSize {
			t.Fatalf("reply of the largest frame: %d bytes, %v", len(resp), err)
		}
	})
	if _, err := r.client.Call(ctx, opEcho, []byte("still")); err != nil {
		t.Fatalf("Call after the errors: %v", err)
	}
	if d := r.dialCount(); d != 1 {
		t.Fatalf("%d dials, want 1: an error closed the connection", d)
	}
}

func TestRegisterError(t *testing.T) {
	for _, code := range []uint16{0, 1, FirstUserCode - 1, FirstUserCode} { // the last is taken (helpers_test.go)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("RegisterError(%d) did not panic", code)
				}
			}()
			RegisterError(code, errors.New("x"))
		}()
	}
}

// TestClient_Call_Cancel: ctx ending at each wait of a call returns ctx's
// error at once, leaves nothing running, and the connection goes on.
func TestClient_Call_Cancel(t *testing.T) {
	leakCheck(t)
	t.Run("BeforeSend", func(t *testing.T) {
		r := newRPCNode(t, ServerConfig{}, ClientConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := r.client.Call(ctx, opEcho, nil); err != context.Canceled {
			t.Fatalf("Call = %v, want context.Canceled", err)
		}
		if d := r.dialCount(); d != 0 {
			t.Fatalf("%d dials for a cancelled call", d)
		}
	})
	t.Run("WhileDialing", func(t *testing.T) {
		release := make(chan struct{})
		c := NewClient(func(ctx context.Context) (*transport.Conn, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, errors.New("no dial")
		}, ClientConfig{})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := c.Call(ctx, opEcho, nil); err != context.DeadlineExceeded {
			t.Fatalf("Call = %v, want context.DeadlineExceeded", err)
		}
		close(release)
		if _, err := c.Call(ctxT(t), opEcho, nil); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Call with a failing dial = %v, want ErrUnavailable", err)
		}
	})
	t.Run("WhileWaiting", func(t *testing.T) {
		r := newRPCNode(t, ServerConfig{}, ClientConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { _, err := r.client.Call(ctx, opBlock, nil); errc <- err }()
		waitFor(t, "the request at its handler", func() bool { return r.arrived.Load() == 1 })
		cancel()
		if err := <-errc; err != context.Canceled {
			t.Fatalf("Call = %v, want context.Canceled", err)
		}
		// The cancel frame reaches the handler.
		select {
		case err := <-r.blocked:
			if err != context.Canceled {
				t.Fatalf("handler's ctx ended with %v", err)
			}
		case <-time.After(patience):
			t.Fatal("the handler's ctx was not cancelled")
		}
		if resp, err := r.client.Call(ctxT(t), opEcho, []byte("x")); err != nil || string(resp) != "x" {
			t.Fatalf("Call after a cancelled one: %q, %v", resp, err)
		}
	})
	t.Run("WhileSending", func(t *testing.T) {
		// A peer that never reads: the writer blocks on a full socket and
		// the next call waits to hand its frame over.
		tr := newTransport(t, "sink", 0)
		l, err := tr.Listener(transport.ProtoRPC)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			if c, err := l.Accept(); err == nil {
				accepted <- c
			}
		}()
		cli := newTransport(t, "client", 0)
		c := NewClient(func(ctx context.Context) (*transport.Conn, error) {
			return cli.Dial(ctx, tr.Addr().String(), transport.ProtoRPC)
		}, ClientConfig{})
		defer c.Close()
		big := make([]byte, 1<<20)
		var wg sync.WaitGroup
		defer wg.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for range 64 { // 64 MiB: more than any socket buffers
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Call(ctx, opEcho, big); err != context.Canceled {
					t.Errorf("Call = %v, want context.Canceled", err)
				}
			}()
		}
		select {
		case sc := <-accepted:
			defer sc.Close()
		case <-time.After(patience):
			t.Fatal("no connection")
		}
		time.Sleep(100 * time.Millisecond) // let the writer fill the socket
		cancel()
		wg.Wait()
	})
}

// TestClient_Call_ServerGone: a server closing fails the calls in flight
// with ErrUnavailable; the next call dials the restarted server.
func TestClient_Call_ServerGone(t *testing.T) {
	leakCheck(t)
	r := newRPCNode(t, ServerConfig{}, ClientConfig{})
	errc := make(chan error, 10)
	for range 10 {
		go func() { _, err := r.client.Call(ctxT(t), opBlock, nil); errc <- err }()
	}
	waitFor(t, "the requests at their handler", func() bool { return r.arrived.Load() == 10 })
	r.stop()
	for range 10 {
		if err := <-errc; !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Call through the server's Close = %v, want ErrUnavailable", err)
		}
	}
	if _, err := r.client.Call(ctxT(t), opEcho, nil); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Call with the server down = %v, want ErrUnavailable", err)
	}
	r.start()
	if resp, err := r.client.Call(ctxT(t), opEcho, []byte("back")); err != nil || string(resp) != "back" {
		t.Fatalf("Call after the restart: %q, %v", resp, err)
	}
	if d := r.dialCount(); d != 3 {
		t.Fatalf("%d dials, want 3 (first, refused, after the restart)", d)
	}
}

// TestClient_Close: Close during calls ends them with ErrClosed (or their
// reply), waits for the client's goroutines, and later calls fail.
func TestClient_Close(t *testing.T) {
	leakCheck(t)
	r := newRPCNode(t, ServerConfig{}, ClientConfig{})
	var wg sync.WaitGroup
	var calls atomic.Int64
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := r.client.Call(ctxT(t), opEcho, []byte("x"))
				calls.Add(1)
				if err == nil {
					continue
				}
				if !errors.Is(err, ErrClosed) {
					t.Errorf("Call during Close = %v, want ErrClosed", err)
				}
				return
			}
		}()
	}
	waitFor(t, "calls", func() bool { return calls.Load() > 100 })
	var cwg sync.WaitGroup
	for range 3 {
		cwg.Add(1)
		go func() { defer cwg.Done(); r.client.Close() }()
	}
	cwg.Wait()
	wg.Wait()
	if _, err := r.client.Call(ctxT(t), opEcho, nil); err != ErrClosed {
		t.Fatalf("Call after Close = %v, want ErrClosed", err)
	}
}

// TestServer_Close: Close cancels running handlers and waits for them.
func TestServer_Close(t *testing.T) {
	leakCheck(t)
	r := newRPCNode(t, ServerConfig{}, ClientConfig{})
	go r.client.Call(ctxT(t), opBlock, nil)
	waitFor(t, "the request at its handler", func() bool { return r.arrived.Load() == 1 })
	r.stop()
	select {
	case err := <-r.blocked:
		if err != context.Canceled {
			t.Fatalf("handler's ctx = %v", err)
		}
	default:
		t.Fatal("Close returned before the handler")
	}
	r.stop() // again
}

// TestClient_IdleTimeout: the client closes an idle connection itself
// (before the server would), never one with a call pending, and the next
// call dials again.
func TestClient_IdleTimeout(t *testing.T) {
	leakCheck(t)
	r := newRPCNode(t, ServerConfig{}, ClientConfig{IdleTimeout: 100 * time.Millisecond})
	errc := make(chan error, 1)
	go func() { _, err := r.client.Call(ctxT(t), opGate, u32(0)); errc <- err }()
	waitFor(t, "the request at its handler", func() bool { return r.arrived.Load() == 1 })
	time.Sleep(500 * time.Millisecond) // five idle timeouts with a call pending
	close(r.gates[0])
	if err := <-errc; err != nil {
		t.Fatalf("a call longer than the idle timeout: %v", err)
	}
	waitFor(t, "the idle connection to close", func() bool { return r.conns() == 0 })
	r.stillServes(t)
	if d := r.dialCount(); d != 2 {
		t.Fatalf("%d dials, want 2", d)
	}
}

// TestServer_CombinedReplies: replies combined into one write, small ones
// copied and large ones (over copyMax) written from the handler's buffer,
// each reach their own call whole, whatever their sizes and order.
func TestServer_CombinedReplies(t *testing.T) {
	r := newRPCNode(t, ServerConfig{}, ClientConfig{})
	sizes := []int{0, 10, copyMax, copyMax + 1, 200 << 10}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				req := make([]byte, sizes[(g+i)%len(sizes)])
				for k := range req {
					req[k] = byte(g*31 + i*7 + k)
				}
				resp, err := r.client.Call(ctxT(t), opEcho, req)
				if err != nil || !bytes.Equal(resp, req) {
					t.Errorf("call %d/%d of %d bytes: %d bytes back, %v", g, i, len(req), len(resp), err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestServer_RepliesDoNotWaitForHandlers: a reply is written while other
// handlers of its connection still run (a long poll, here one blocked
// until its call gives up): no reply waits for a batch to fill.
func TestServer_RepliesDoNotWaitForHandlers(t *testing.T) {
	r := newRPCNode(t, ServerConfig{}, ClientConfig{})
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := r.client.Call(ctx, opBlock, nil)
		done <- err
	}()
	waitFor(t, "the blocked handler to run", func() bool { return r.arrived.Load() == 1 })
	start := time.Now()
	for i := range 200 {
		if resp, err := r.client.Call(ctxT(t), opEcho, []byte{byte(i)}); err != nil || len(resp) != 1 || resp[0] != byte(i) {
			t.Fatalf("echo %d: %x, %v", i, resp, err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("200 echoes beside a blocked handler took %v", d)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("blocked call: %v, want context.Canceled", err)
	}
}
