package transport

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

func TestTransport_SetLinkDown(t *testing.T) {
	a, b := pair(t, nil)
	accA, accB := accept(t, a, ProtoRPC), accept(t, b, ProtoRaft)
	dial := func(from, to *Transport, p Proto) (*Conn, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return from.Dial(ctx, to.Addr().String(), p)
	}
	ab, err := dial(a, b, ProtoRaft)
	if err != nil {
		t.Fatal(err)
	}
	defer ab.Close()
	ba, err := dial(b, a, ProtoRPC)
	if err != nil {
		t.Fatal(err)
	}
	defer ba.Close()
	abPeer, baPeer := <-accB.next, <-accA.next

	a.SetLinkDown("b", true)
	t.Run("ClosesBothDirections", func(t *testing.T) {
		for _, c := range []*Conn{ab, ba, abPeer, baPeer} {
			waitClosed(t, c, 10*time.Second)
		}
	})
	t.Run("DialFails", func(t *testing.T) {
		if c, err := dial(a, b, ProtoRaft); !errors.Is(err, ErrLinkDown) {
			if c != nil {
				c.Close()
			}
			t.Fatalf("dial while down: %v, want ErrLinkDown", err)
		}
	})
	t.Run("AcceptRefused", func(t *testing.T) {
		before := accA.count()
		c, err := dial(b, a, ProtoRPC)
		if err == nil { // a refuses after its accept byte: b sees the close
			waitClosed(t, c, 10*time.Second)
			c.Close()
		}
		if n := accA.count(); n != before {
			t.Fatalf("a accepted %d connections from b while the link was down", n-before)
		}
	})
	t.Run("OtherPeersUnaffected", func(t *testing.T) {
		c := listen(t, Config{NodeID: "c"})
		cc, err := dial(c, b, ProtoRaft)
		if err != nil {
			t.Fatal(err)
		}
		cc.Close()
		<-accB.next
	})

	a.SetLinkDown("b", false)
	t.Run("Restored", func(t *testing.T) {
		c1, err := dial(a, b, ProtoRaft)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := dial(b, a, ProtoRPC)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []*Conn{c1, c2, <-accB.next, <-accA.next} {
			c.Close()
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if n := len(a.links.live["b"]); n != 0 {
			t.Fatalf("a still tracks %d connections with b after closing them all", n)
		}
	})
}

// A muted side's writes stall while the other direction's arrive; once
// the link is restored they arrive in order. A stalled write ends with its
// deadline or its connection's close.
func TestTransport_SetLinkMutedCutsOneWay(t *testing.T) {
	a, b := pair(t, newCA(t))
	accB := accept(t, b, ProtoRPC)
	dial := func() (*Conn, *Conn) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := a.Dial(ctx, b.Addr().String(), ProtoRPC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, <-accB.next
	}
	// read returns what c got within d.
	read := func(c *Conn, d time.Duration) string {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(d))
		buf := make([]byte, 64)
		n, _ := c.Read(buf)
		return string(buf[:n])
	}
	write := func(c *Conn, s string) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := c.Write([]byte(s))
			done <- err
		}()
		return done
	}
	ab, abPeer := dial()
	a.SetLinkMuted("b", true)
	held := write(ab, "held")
	if got := read(abPeer, 300*time.Millisecond); got != "" {
		t.Fatalf("b read %q that a wrote while muted", got)
	}
	if _, err := abPeer.Write([]byte("heard")); err != nil {
		t.Fatal(err)
	}
	if got := read(ab, 10*time.Second); got != "heard" {
		t.Fatalf("a read %q from b while only a's side was muted, want heard", got)
	}

	t.Run("DeadlineEndsAStalledWrite", func(t *testing.T) {
		c, _ := dial() // handshakes pass while muted
		_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		if err := <-write(c, "late"); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("stalled write past its deadline: %v, want os.ErrDeadlineExceeded", err)
		}
	})
	t.Run("CloseEndsAStalledWrite", func(t *testing.T) {
		c, _ := dial()
		done := write(c, "never")
		time.Sleep(50 * time.Millisecond)
		c.Close()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("a write stalled on a closed connection reported success")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a stalled write did not end when its connection closed")
		}
	})

	a.SetLinkMuted("b", false)
	if err := <-held; err != nil {
		t.Fatalf("the write stalled while muted: %v", err)
	}
	if got := read(abPeer, 10*time.Second); got != "held" {
		t.Fatalf("b read %q once the link was restored, want held", got)
	}
	if a.muted.Load() != nil {
		t.Fatal("a still keeps a muted set with no peer muted")
	}
}
