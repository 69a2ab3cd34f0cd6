package transport

import (
	"encoding/binary"
	"errors"
	"time"
)

// A yamux frame starts with a header, laid out as hashicorp/yamux v0.1.2
// writes it (const.go), big-endian:
//
//	[version u8, 0][type u8][flags u16][stream id u32][length u32]
//
// A data frame (type 0) is followed by length payload bytes; a window
// update (1), a ping (2) and a go-away (3) carry none, their length being
// a window delta, the ping's id and a code.
const (
	yamuxHeaderLen = 12
	yamuxTypeData  = 0
	yamuxTypePing  = 2
	yamuxFlagSYN   = 1
	// maxPings bounds the ping requests a session's peer may send within
	// pingWindow; a peer's yamux pings once per KeepAlive.
	maxPings   = 64
	pingWindow = time.Second
)

var errPingFlood = errors.New("transport: raft session: the peer sent pings faster than the bound")

// pingGuard is the connection a yamux session reads from. yamux v0.1.2
// answers each ping request from a goroutine of its own, which waits up to
// the KeepAlive for room to send, so a peer that sends pings and reads
// nothing would hold a goroutine per ping. pingGuard follows the frame
// headers as they pass, without buffering, and when more than maxPings
// ping requests arrive within pingWindow it closes the connection, calls
// flood and fails the read, with none of that read's bytes passed on:
// yamux then closes the session. Reads must come from one goroutine, as
// yamux's do.
type pingGuard struct {
	*Conn
	flood func() // called once, when the connection is closed for its pings

	hdr   [yamuxHeaderLen]byte
	hn    int       // bytes of the current header in hdr
	skip  uint32    // payload bytes of a data frame still to pass
	since time.Time // the start of the current window
	pings int       // ping requests in the current window
	bad   bool      // closed for its pings
}

func (g *pingGuard) Read(p []byte) (int, error) {
	if g.bad {
		return 0, errPingFlood
	}
	n, err := g.Conn.Read(p)
	if n > 0 && !g.scan(p[:n]) {
		g.bad = true
		g.Conn.Close()
		if g.flood != nil {
			g.flood()
		}
		return 0, errPingFlood
	}
	return n, err
}

// scan follows the frames in b; false when a ping request is one too many.
func (g *pingGuard) scan(b []byte) bool {
	for len(b) > 0 {
		if g.skip > 0 {
			k := uint32(min(uint64(g.skip), uint64(len(b))))
			g.skip -= k
			b = b[k:]
			continue
		}
		k := copy(g.hdr[g.hn:], b)
		g.hn += k
		b = b[k:]
		if g.hn < yamuxHeaderLen {
			return true
		}
		g.hn = 0
		switch g.hdr[1] {
		case yamuxTypeData:
			g.skip = binary.BigEndian.Uint32(g.hdr[8:])
		case yamuxTypePing:
			if binary.BigEndian.Uint16(g.hdr[2:])&yamuxFlagSYN == 0 {
				continue
			}
			if now := time.Now(); now.Sub(g.since) >= pingWindow {
				g.since, g.pings = now, 0
			}
			if g.pings++; g.pings > maxPings {
				return false
			}
		}
	}
	return true
}
