package transport

import (
	"context"
	"errors"
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
