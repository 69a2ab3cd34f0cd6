package transport

import (
	"encoding/binary"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestRaftMux_PingFloodSpawnsNoGoroutines: a peer that passed the
// handshake, member of no group (x9: the secret in plaintext mode, or a
// certificate of the cluster's CA and the secret under TLS), opens a raft
// session and sends yamux ping requests, 12 bytes each, without reading
// the answers. hashicorp/yamux v0.1.2 answers each ping from a goroutine
// of its own, which waits up to ConnectionWriteTimeout (the KeepAlive,
// 10 s) for room in the session's send queue; once the attacker's socket
// is full, every further ping holds a goroutine, its stack and a timer.
// The node must not hold more than a small multiple of what was sent, nor
// a goroutine per frame.
func TestRaftMux_PingFloodSpawnsNoGoroutines(t *testing.T) {
	verifyNone(t)
	a := newNode(t, newBook(), "a", RaftMuxConfig{})
	layerOf(t, a, "g", only("n1"))

	raw, err := net.Dial("tcp", a.t.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.(*net.TCPConn).SetReadBuffer(4096) // read nothing, hold little
	raw.SetDeadline(time.Now().Add(waitFor))
	if _, err := handshakeDialer(raw, nil, "x9", secret, ProtoRaft); err != nil {
		t.Fatal(err)
	}
	raw.SetDeadline(time.Time{})

	const pings = 100_000
	frames := make([]byte, 0, 12*pings)
	for i := range pings {
		var h [12]byte
		h[1] = 2                             // typePing
		binary.BigEndian.PutUint16(h[2:], 1) // flagSYN
		binary.BigEndian.PutUint32(h[8:], uint32(i))
		frames = append(frames, h[:]...)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	raw.SetWriteDeadline(time.Now().Add(20 * time.Second))
	if _, err := raw.Write(frames); err != nil && !closedByPeer(err) {
		t.Fatalf("write pings: %v", err)
	} // the node may close the session before it has read every ping
	peak := 0
	var after runtime.MemStats
	for range 20 {
		time.Sleep(50 * time.Millisecond)
		peak = max(peak, runtime.NumGoroutine()-g0)
	}
	runtime.ReadMemStats(&after)
	held := int64(after.StackInuse+after.HeapInuse) - int64(before.StackInuse+before.HeapInuse)
	t.Logf("%d pings (%d bytes): +%d goroutines, +%d KiB stack and heap in use", pings, len(frames), peak, held>>10)
	if peak > 1000 {
		t.Errorf("%d ping frames held %d goroutines on the node", pings, peak)
	}
	if bound := int64(16*len(frames) + 512<<10); held > bound {
		t.Errorf("%d bytes of pings made the node hold %d bytes, more than 16x + 512 KiB", len(frames), held)
	}
}
