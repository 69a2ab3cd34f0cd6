package remote

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestClient_SilentPeer_Redials: a peer that stops answering without a
// reset (the link frozen by a proxy, the TCP connection left open) fails
// the call by its ctx; the ping that follows goes unanswered, so the
// client drops the connection within its ProbeTimeout and the next call
// dials anew. (Before, the connection stayed, and every later call queued
// behind it until its ctx ended.)
func TestClient_SilentPeer_Redials(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"Plaintext", false}, {"TLS", true}} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			const probe = 200 * time.Millisecond
			c, p := proxiedEcho(t, tc.tls, ClientConfig{ProbeTimeout: probe})
			if got, err := c.Call(ctxT(t), opEcho, []byte("a")); err != nil || string(got) != "a" {
				t.Fatalf("call before the freeze: %q, %v", got, err)
			}

			p.freeze()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := c.Call(ctx, opEcho, []byte("b"))
			if !isDeadline(err) {
				t.Fatalf("call to the silent peer: %v, want its ctx's deadline", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("call to the silent peer returned after %v", d)
			}

			dropBy := time.Now().Add(10 * probe)
			for c.connected() {
				if time.Now().After(dropBy) {
					t.Fatalf("connection to the silent peer still held %v after the call", 10*probe)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if got, err := c.Call(ctxT(t), opEcho, []byte("c")); err != nil || string(got) != "c" {
				t.Fatalf("call after the drop: %q, %v", got, err)
			}
			if n := p.connections(); n != 2 {
				t.Fatalf("%d connections through the proxy, want 2: one frozen, one dialed anew", n)
			}
		})
	}
}

// TestClient_SilentPeer_CallsFail: the calls in flight on a connection
// found silent fail with ErrUnavailable, not at their own deadline.
func TestClient_SilentPeer_CallsFail(t *testing.T) {
	leakCheck(t)
	const probe = 200 * time.Millisecond
	c, p := proxiedEcho(t, false, ClientConfig{ProbeTimeout: probe})
	if _, err := c.Call(ctxT(t), opEcho, nil); err != nil {
		t.Fatal(err)
	}
	p.freeze()
	errc := make(chan error, 1)
	go func() { _, err := c.Call(ctxT(t), opEcho, nil); errc <- err }()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Call(ctx, opEcho, nil); !isDeadline(err) {
		t.Fatalf("short call: %v, want its deadline", err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errSilent) {
			t.Fatalf("call on the silent connection: %v, want ErrUnavailable for the ping", err)
		}
	case <-time.After(10 * probe):
		t.Fatalf("call on the silent connection still waits %v after the ping", 10*probe)
	}
}

// TestClient_LongPoll_NotSilent: a call giving up beside a long poll
// (a handler waiting on the server) sends a ping the server answers: the
// connection stays, and the long poll gets its reply on it.
func TestClient_LongPoll_NotSilent(t *testing.T) {
	leakCheck(t)
	const probe = 2 * time.Second // a loaded machine's -race run answers in time
	r := newRPCNode(t, ServerConfig{}, ClientConfig{ProbeTimeout: probe})
	errc := make(chan error, 1)
	go func() { _, err := r.client.Call(ctxT(t), opGate, u32(0)); errc <- err }()
	waitFor(t, "the long poll at its handler", func() bool { return r.arrived.Load() == 1 })
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := r.client.Call(ctx, opGate, u32(1))
		cancel()
		if !isDeadline(err) {
			t.Fatalf("short call: %v, want its deadline", err)
		}
		time.Sleep(probe + 200*time.Millisecond) // past the ping's deadline
	}
	close(r.gates[0])
	if err := <-errc; err != nil {
		t.Fatalf("long poll: %v", err)
	}
	if n := r.dialCount(); n != 1 {
		t.Fatalf("%d dials, want 1: the connection was taken for dead", n)
	}
}

// TestServer_Ping: a ping is answered with an empty reply of its id, from
// the reading loop.
func TestServer_Ping(t *testing.T) {
	leakCheck(t)
	r := newRPCNode(t, ServerConfig{}, ClientConfig{})
	c := r.dial()
	fr := c.FrameReader()
	if _, err := c.Write(rawFrame(t, 7, opPing, nil)); err != nil {
		t.Fatal(err)
	}
	if f := readReply(t, c, fr); f.ReqID != 7 || f.Op != opReply || len(f.Payload) != 0 {
		t.Fatalf("reply to a ping: %+v, want an empty opReply of id 7", f)
	}
}
