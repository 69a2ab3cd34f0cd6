package transport

import (
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestRaftMux_RefusedStreamsHoldNothing: a peer that passed the handshake,
// member of no group, opens raft streams as fast as it can (a yamux SYN,
// 12 bytes each) and never closes them, reading what the node sends. The
// mux refuses each one (a header that never comes, or a group it is no
// member of) with a yamux Close, which only half-closes: the stream stays
// in the session, with its channels and a close timer, until the peer's
// FIN that never comes or StreamCloseTimeout (6 x KeepAlive, 60 s). The
// node must not hold much more than the peer sent.
func TestRaftMux_RefusedStreamsHoldNothing(t *testing.T) {
	verifyNone(t)
	a := newNode(t, newBook(), "a", RaftMuxConfig{HeaderTimeout: 200 * time.Millisecond})
	layerOf(t, a, "g", only("n1"))

	raw, err := net.Dial("tcp", a.t.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(waitFor))
	if _, err := handshakeDialer(raw, nil, "x9", secret, ProtoRaft); err != nil {
		t.Fatal(err)
	}
	raw.SetDeadline(time.Time{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_, _ = io.Copy(io.Discard, raw)
	}()

	const streams = 100_000
	hdr := appendStreamHeader(nil, "g")
	frames := make([]byte, 0, streams*(24+len(hdr)))
	for i := range streams {
		id := uint32(2*i + 1) // a client's streams are odd
		var h [12]byte
		h[1] = 0                             // typeData
		binary.BigEndian.PutUint16(h[2:], 1) // flagSYN
		binary.BigEndian.PutUint32(h[4:], id)
		if i%2 == 0 { // every other one names a group the peer is no member of
			binary.BigEndian.PutUint32(h[8:], uint32(len(hdr)))
			frames = append(frames, h[:]...)
			frames = append(frames, hdr...)
			continue
		}
		frames = append(frames, h[:]...)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const chunk = 12_000 * (12 + 2)
	for off := 0; off < len(frames); off += chunk {
		raw.SetWriteDeadline(time.Now().Add(20 * time.Second))
		if _, err := raw.Write(frames[off:min(off+chunk, len(frames))]); err != nil {
			if closedByPeer(err) {
				break // the node closed the session: it holds none of them
			}
			t.Fatalf("write streams: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // let the mux refuse them: the accept backlog is 256
	}
	time.Sleep(time.Second) // every header read or timed out
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapInuse+after.StackInuse) - int64(before.HeapInuse+before.StackInuse)
	t.Logf("%d refused streams (%d bytes): +%d KiB held a second later", streams, len(frames), held>>10)
	if bound := int64(16*len(frames) + 512<<10); held > bound {
		t.Errorf("%d bytes of refused streams made the node hold %d bytes, more than 16x + 512 KiB", len(frames), held)
	}
	raw.Close()
	<-drained
}
