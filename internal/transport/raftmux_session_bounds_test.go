package transport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// TestPingGuard: maxPings ping requests within pingWindow pass, one more
// fails; answers to pings, and ping headers inside a data frame's
// payload, do not count; frames split anywhere are followed.
func TestPingGuard(t *testing.T) {
	frame := func(typ byte, flags uint16, length uint32, payload []byte) []byte {
		h := make([]byte, yamuxHeaderLen, yamuxHeaderLen+len(payload))
		h[1] = typ
		binary.BigEndian.PutUint16(h[2:], flags)
		binary.BigEndian.PutUint32(h[4:], 1)
		binary.BigEndian.PutUint32(h[8:], length)
		return append(h, payload...)
	}
	ping := frame(yamuxTypePing, yamuxFlagSYN, 7, nil)
	var pings []byte
	for range maxPings {
		pings = append(pings, ping...)
	}
	data := frame(yamuxTypeData, 0, uint32(len(pings)), pings)
	ack := frame(yamuxTypePing, 2, 7, nil)       // flagACK: an answer
	window := frame(1, yamuxFlagSYN, 1<<20, nil) // a window update opening a stream
	stream := slices.Concat(data, ack, window, pings, data, ack)
	for _, step := range []int{len(stream), 1, 5, 13} {
		t.Run(fmt.Sprintf("Split%d", step), func(t *testing.T) {
			var g pingGuard
			for off := 0; off < len(stream); off += step {
				if !g.scan(stream[off:min(off+step, len(stream))]) {
					t.Fatalf("%d pings refused at byte %d", maxPings, off)
				}
			}
			if g.scan(ping) {
				t.Fatalf("ping %d within %v passed", maxPings+1, pingWindow)
			}
		})
	}
	t.Run("NextWindow", func(t *testing.T) {
		var g pingGuard
		if !g.scan(pings) {
			t.Fatal("refused within the bound")
		}
		g.since = g.since.Add(-pingWindow)
		if !g.scan(pings) {
			t.Fatal("refused a window later")
		}
	})
}

// TestRaftMux_RefusedStreamsCloseSession: an inbound session survives
// refused streams up to maxRefusedStreams since its last accepted one, and
// streams of a group not registered here from a member of another group
// (raft redialing a group this node opens later), however many; past the
// bound, refusals of a group the peer is no member of close the session.
func TestRaftMux_RefusedStreamsCloseSession(t *testing.T) {
	verifyNone(t)
	a := newNode(t, newBook(), "a", RaftMuxConfig{})
	lg := layerOf(t, a, "g", only("evil"))
	layerOf(t, a, "h", only("n1"))
	s := attacker(t, a)
	refuse := func(t *testing.T, group string, n int) {
		t.Helper()
		for range n {
			st, err := s.Open()
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			if _, err := st.Write(appendStreamHeader(nil, group)); err != nil {
				t.Fatalf("write: %v", err)
			}
			waitClosed(t, st, waitFor)
			st.Close()
		}
	}
	refuse(t, "later", 4*maxRefusedStreams)
	refuse(t, "h", maxRefusedStreams-8)
	accepted(t, s, lg)
	refuse(t, "h", maxRefusedStreams-8)
	if s.IsClosed() {
		t.Fatal("the session was closed within the bound")
	}
	deadline := time.Now().Add(waitFor)
	for !s.IsClosed() {
		if time.Now().After(deadline) {
			t.Fatal("refusals past the bound left the session open")
		}
		st, err := s.Open()
		if err != nil {
			break // closed meanwhile
		}
		_, _ = st.Write(appendStreamHeader(nil, "h"))
		st.Close()
		time.Sleep(time.Millisecond)
	}
}

// accepted opens a stream of l's group on s and takes it from l.
func accepted(t *testing.T, s *yamux.Session, l *RaftLayer) {
	t.Helper()
	st, err := s.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Write(appendStreamHeader(nil, l.group)); err != nil {
		t.Fatal(err)
	}
	got, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	got.Close()
}

// FuzzPingGuard: the guard follows any bytes without panicking, and
// whether it refuses them does not depend on how reads split them.
func FuzzPingGuard(f *testing.F) {
	hdr := func(typ byte, flags uint16, length uint32) []byte {
		h := make([]byte, yamuxHeaderLen)
		h[1] = typ
		binary.BigEndian.PutUint16(h[2:], flags)
		binary.BigEndian.PutUint32(h[8:], length)
		return h
	}
	f.Add(hdr(yamuxTypePing, yamuxFlagSYN, 1), 5)
	f.Add(slices.Concat(hdr(yamuxTypeData, 0, 3), []byte("abc"), hdr(yamuxTypePing, yamuxFlagSYN, 2)), 7)
	f.Add(bytes.Repeat(hdr(yamuxTypePing, yamuxFlagSYN, 1), maxPings+1), 13)
	f.Fuzz(func(t *testing.T, b []byte, step int) {
		step = 1 + int(uint(step)%uint(max(len(b), 1)))
		var whole, split pingGuard
		want := whole.scan(b)
		got := true
		for off := 0; off < len(b) && got; off += step {
			got = split.scan(b[off:min(off+step, len(b))])
		}
		if got != want {
			t.Fatalf("refused whole: %v, in pieces of %d: %v", !want, step, !got)
		}
	})
}
