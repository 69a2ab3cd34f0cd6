package transport

import (
	"errors"
	"fmt"
	"math"
)

// An inbound raft stream carries hashicorp/raft's NetworkTransport
// requests, one after the other, each laid out as
//
//	[type byte, 0..4][msgpack map of the request's fields]
//
// and an InstallSnapshot request (type 2) is followed by its snapshot,
// raw, of the request's Size bytes. The fields are raft's struct fields
// by name (hashicorp/go-msgpack flattens the embedded RPCHeader): "ID"
// and "Addr" name the sender, "Leader" (AppendEntries, InstallSnapshot)
// and "Candidate" (RequestVote) too, in raft's older layout. Over a
// RaftMux a node's raft server id and address are both its node id.
//
// rpcCheck reads these bytes as they pass to raft, without buffering them,
// and fails a request whose sender fields are not the connection's proven
// peer: ID and Addr must be present and equal to it, Leader and Candidate
// empty or equal to it, every time they occur. A key or a sender field in
// another encoding than str or bin, which raft never writes, fails too.
// Raft decodes a request only once it has all of its bytes, and the check
// of a chunk ends before raft gets any byte of it, so raft never acts on a
// request that fails.
const (
	rpcTypeAppendEntries   = 0
	rpcTypeRequestVote     = 1
	rpcTypeInstallSnapshot = 2
	rpcTypeTimeoutNow      = 3
	rpcTypeRequestPreVote  = 4
	maxRPCType             = 4 // RequestPreVote, the last of raft v1.7.3's
	// maxCheckDepth bounds the nesting of a request's values; raft's are
	// four deep (the request, Entries, a Log, its fields).
	maxCheckDepth = 32
	maxKeyLen     = len("Candidate")
)

var errBadRPC = errors.New("bad raft request")

// checkState is where rpcCheck is in the stream.
type checkState uint8

const (
	csType checkState = iota // a request's type byte
	csLead                   // a value's first byte
	csLen                    // a length or an integer: hlen bytes into hdr
	csBody                   // a str, bin or ext payload, or a scalar's bytes: left bytes
	csRaw                    // an InstallSnapshot's snapshot: left bytes
)

// valRole is what a value is to the check.
type valRole uint8

const (
	roleTop    valRole = iota // the request: a map
	roleKey                   // a key of the request's map: str or bin
	roleSender                // ID, Addr, Leader or Candidate: nil, str or bin
	roleSize                  // an InstallSnapshot's Size: nil or an integer
	roleSkip                  // anything else, read past
)

// lenKind is what the bytes collected in csLen are.
type lenKind uint8

const (
	lenStr   lenKind = iota // a str or bin length
	lenExt                  // an ext length: a type byte and the payload follow
	lenArray                // an array's count
	lenMap                  // a map's count
	lenUint                 // an unsigned integer's value
	lenInt                  // a signed integer's value
)

// field is a sender field or Size, named by a key of the request's map.
type field uint8

const (
	fieldNone field = iota
	fieldID
	fieldAddr
	fieldLeader
	fieldCandidate
	fieldSize
)

// rpcCheck follows one inbound raft stream; see above. Not safe for
// concurrent use: raft reads a stream from one goroutine.
type rpcCheck struct {
	peer string

	state checkState
	rpc   byte    // the request's type
	role  valRole // of the value being read
	lb    byte    // the value's first byte
	kind  lenKind // in csLen
	hdr   [8]byte
	hn    int    // bytes in hdr
	hlen  int    // bytes wanted in hdr
	left  uint64 // csBody, csRaw: bytes still to pass

	capture bool                  // csBody: collect the payload in val
	val     [MaxNodeIDLen]byte    // a key or a sender field as read so far
	vn      int                   // bytes in val
	long    bool                  // the payload did not fit in val
	field   field                 // named by the last key of the request's map
	stack   [maxCheckDepth]uint64 // the open containers' items still to come
	depth   int

	id, addr bool  // ID and Addr seen
	size     int64 // Size, as raft will read it

	vote     func(candidate string) bool // LayerConfig.Vote; nil grants every vote
	campaign func() bool                 // LayerConfig.Campaign; nil takes every TimeoutNow
	follow   func(leader string) bool    // LayerConfig.Lead; nil takes every leader's entries
}

// errWithheld closes a stream carrying a request this replica withholds
// its part from: a request for a vote or a
// pre-vote that this replica withholds from the peer (LayerConfig.Vote):
// raft's candidate counts it as not granted. It closes one carrying a
// TimeoutNow (a leadership transfer) to a replica that may not campaign
// (LayerConfig.Campaign) too: the transfer fails, and the leader stays;
// and one carrying entries from a leader the replica does not follow
// (LayerConfig.Lead): they are not acknowledged.
var errWithheld = errors.New("transport: withheld by the replica")

func newRPCCheck(peer string, vote func(candidate string) bool, campaign func() bool, lead func(leader string) bool) *rpcCheck {
	return &rpcCheck{peer: peer, vote: vote, campaign: campaign, follow: lead}
}

// feed checks the next bytes of the stream; after an error the stream is
// to be closed, and feed must not be called again.
func (c *rpcCheck) feed(b []byte) error {
	for len(b) > 0 {
		switch c.state {
		case csType:
			if b[0] > maxRPCType {
				return fmt.Errorf("%w: request type %d", errBadRPC, b[0])
			}
			if (b[0] == rpcTypeRequestVote || b[0] == rpcTypeRequestPreVote) && c.vote != nil && !c.vote(c.peer) {
				return errWithheld
			}
			if b[0] == rpcTypeTimeoutNow && c.campaign != nil && !c.campaign() {
				return errWithheld
			}
			if (b[0] == rpcTypeAppendEntries || b[0] == rpcTypeInstallSnapshot) && c.follow != nil && !c.follow(c.peer) {
				return errWithheld
			}
			c.rpc, c.id, c.addr, c.size = b[0], false, false, 0
			c.state = csLead
			b = b[1:]
		case csLead:
			lead := b[0]
			b = b[1:]
			if err := c.lead(lead); err != nil {
				return err
			}
		case csLen:
			n := copy(c.hdr[c.hn:c.hlen], b)
			c.hn += n
			b = b[n:]
			if c.hn == c.hlen {
				if err := c.lenDone(); err != nil {
					return err
				}
			}
		case csBody:
			n := int(min(c.left, uint64(len(b))))
			if c.capture {
				k := copy(c.val[c.vn:], b[:n])
				c.vn += k
				c.long = c.long || k < n
			}
			c.left -= uint64(n)
			b = b[n:]
			if c.left == 0 {
				if err := c.valueDone(); err != nil {
					return err
				}
			}
		case csRaw:
			n := min(c.left, uint64(len(b)))
			c.left -= n
			b = b[n:]
			if c.left == 0 {
				c.state = csType
			}
		}
	}
	return nil
}

// nextRole is the role of the value about to start.
func (c *rpcCheck) nextRole() valRole {
	switch {
	case c.depth == 0:
		return roleTop
	case c.depth > 1:
		return roleSkip
	case c.stack[0]%2 == 0: // the request's map: keys and values alternate
		return roleKey
	case c.field == fieldSize && c.rpc == rpcTypeInstallSnapshot:
		return roleSize
	case c.field != fieldNone && c.field != fieldSize:
		return roleSender
	}
	return roleSkip
}

// lead reads a value's first byte.
func (c *rpcCheck) lead(b byte) error {
	c.role, c.lb = c.nextRole(), b
	switch {
	case b <= 0x7f || b >= 0xe0: // fixint
		return c.integer(int64(int8(b)))
	case b <= 0x8f: // fixmap
		return c.container(true, uint64(b&0x0f))
	case b <= 0x9f: // fixarray
		return c.container(false, uint64(b&0x0f))
	case b <= 0xbf: // fixstr
		return c.str(uint64(b & 0x1f))
	}
	switch b {
	case 0xc0: // nil
		switch c.role {
		case roleSender:
			c.vn, c.long = 0, false
		case roleSize:
			c.size = 0
		case roleSkip:
		default:
			return c.refuse("nil")
		}
		return c.valueDone()
	case 0xc2, 0xc3:
		return c.scalar(0, "a bool")
	case 0xc4, 0xc5, 0xc6: // bin 8, 16, 32
		return c.length(lenStr, 1<<(b-0xc4), "bin")
	case 0xc7, 0xc8, 0xc9: // ext 8, 16, 32
		return c.length(lenExt, 1<<(b-0xc7), "ext")
	case 0xca:
		return c.scalar(4, "a float")
	case 0xcb:
		return c.scalar(8, "a float")
	case 0xcc, 0xcd, 0xce, 0xcf:
		return c.intLen(lenUint, 1<<(b-0xcc))
	case 0xd0, 0xd1, 0xd2, 0xd3:
		return c.intLen(lenInt, 1<<(b-0xd0))
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1..16, after a type byte
		return c.scalar(1+1<<(b-0xd4), "ext")
	case 0xd9, 0xda, 0xdb: // str 8, 16, 32
		return c.length(lenStr, 1<<(b-0xd9), "str")
	case 0xdc, 0xdd:
		return c.length(lenArray, 2<<(b-0xdc), "an array")
	case 0xde, 0xdf:
		return c.length(lenMap, 2<<(b-0xde), "a map")
	}
	return fmt.Errorf("%w: msgpack %#x", errBadRPC, b)
}

func (r valRole) String() string {
	return [...]string{"a map", "a str key", "nil, str or bin", "an integer", "a value"}[r]
}

// length starts reading a length of n bytes; refused unless role allows
// its kind.
func (c *rpcCheck) length(k lenKind, n int, what string) error {
	ok := c.role == roleSkip
	switch k {
	case lenStr:
		ok = ok || c.role == roleKey || c.role == roleSender
	case lenMap:
		ok = ok || c.role == roleTop
	}
	if !ok {
		return c.refuse(what)
	}
	c.kind, c.hn, c.hlen, c.state = k, 0, n, csLen
	return nil
}

// intLen starts reading an integer of n bytes.
func (c *rpcCheck) intLen(k lenKind, n int) error {
	if c.role != roleSkip && c.role != roleSize {
		return c.refuse("an integer")
	}
	c.kind, c.hn, c.hlen, c.state = k, 0, n, csLen
	return nil
}

// lenDone acts on the length or integer collected in hdr.
func (c *rpcCheck) lenDone() error {
	var v uint64
	for _, x := range c.hdr[:c.hlen] {
		v = v<<8 | uint64(x)
	}
	switch c.kind {
	case lenStr:
		return c.str(v)
	case lenExt:
		return c.scalar(v+1, "ext")
	case lenArray, lenMap:
		return c.container(c.kind == lenMap, v)
	case lenUint:
		if c.role == roleSize {
			if v > math.MaxInt64 {
				return fmt.Errorf("%w: snapshot size %d", errBadRPC, v)
			}
			c.size = int64(v)
		}
	case lenInt:
		if c.role == roleSize {
			// Sign-extend the big-endian value of hlen bytes.
			shift := 64 - 8*uint(c.hlen)
			c.size = int64(v<<shift) >> shift
		}
	}
	return c.valueDone()
}

// integer is a fixint.
func (c *rpcCheck) integer(v int64) error {
	switch c.role {
	case roleSize:
		c.size = v
	case roleSkip:
	default:
		return c.refuse("an integer")
	}
	return c.valueDone()
}

// scalar reads past n bytes of a value only roleSkip may be.
func (c *rpcCheck) scalar(n uint64, what string) error {
	if c.role != roleSkip {
		return c.refuse(what)
	}
	if n == 0 {
		return c.valueDone()
	}
	c.left, c.capture, c.state = n, false, csBody
	return nil
}

// str starts a str or bin payload of n bytes, collected for a key or a
// sender field.
func (c *rpcCheck) str(n uint64) error {
	if c.role != roleSkip && c.role != roleKey && c.role != roleSender {
		return c.refuse("a str")
	}
	c.capture = c.role != roleSkip
	c.vn, c.long = 0, false
	if n == 0 {
		return c.valueDone()
	}
	c.left, c.state = n, csBody
	return nil
}

// container opens a map or an array of n entries.
func (c *rpcCheck) container(isMap bool, n uint64) error {
	switch {
	case c.role == roleTop && !isMap:
		return c.refuse("an array")
	case c.role != roleTop && c.role != roleSkip:
		return c.refuse("a container")
	}
	if isMap {
		if n > math.MaxUint64/2 {
			return fmt.Errorf("%w: map of %d entries", errBadRPC, n)
		}
		n *= 2
	}
	if n == 0 {
		return c.valueDone()
	}
	if c.depth == maxCheckDepth {
		return fmt.Errorf("%w: values nested deeper than %d", errBadRPC, maxCheckDepth)
	}
	c.stack[c.depth] = n
	c.depth++
	c.state = csLead
	return nil
}

// valueDone acts on the value just read, as what its role says, and moves
// to the next one.
func (c *rpcCheck) valueDone() error {
	c.state = csLead
	switch c.role {
	case roleTop: // an empty map
		return c.requestDone()
	case roleKey:
		c.field = fieldNone
		if !c.long {
			switch string(c.val[:c.vn]) {
			case "ID":
				c.field = fieldID
			case "Addr":
				c.field = fieldAddr
			case "Leader":
				c.field = fieldLeader
			case "Candidate":
				c.field = fieldCandidate
			case "Size":
				c.field = fieldSize
			}
		}
	case roleSender:
		// Compared without a copy: this runs for every sender field of
		// every request, heartbeats included.
		empty := c.vn == 0 && !c.long
		if !empty && (c.long || string(c.val[:c.vn]) != c.peer) || empty && (c.field == fieldID || c.field == fieldAddr) {
			got := string(c.val[:c.vn])
			if c.long {
				got = string(c.val[:]) + "..."
			}
			return fmt.Errorf("%w: peer %q sent a request whose %s is %q", errBadRPC, c.peer, c.field, got)
		}
		c.id = c.id || c.field == fieldID
		c.addr = c.addr || c.field == fieldAddr
	}
	for c.depth > 0 {
		c.stack[c.depth-1]--
		if c.stack[c.depth-1] > 0 {
			return nil
		}
		c.depth-- // the container is complete: a value of its parent
		if c.depth == 0 {
			return c.requestDone()
		}
	}
	return nil
}

// requestDone checks a request whose map is complete, before raft gets its
// last byte.
func (c *rpcCheck) requestDone() error {
	if !c.id || !c.addr {
		return fmt.Errorf("%w: peer %q sent a request without its ID and Addr", errBadRPC, c.peer)
	}
	c.state = csType
	if c.rpc == rpcTypeInstallSnapshot && c.size > 0 {
		c.left, c.state = uint64(c.size), csRaw
	}
	return nil
}

func (f field) String() string {
	return [...]string{"", "ID", "Addr", "Leader", "Candidate", "Size"}[f]
}

// refuse is the error for the value whose first byte is c.lb, a what.
func (c *rpcCheck) refuse(what string) error {
	return fmt.Errorf("%w: %s (msgpack %#x) where raft's request has %s", errBadRPC, what, c.lb, c.role)
}
