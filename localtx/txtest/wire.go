package txtest

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// PostgreSQL's request codes of untyped messages, and MySQL's capability
// flags that make the protocol unreadable.
const (
	pgSSLRequest        = 80877103
	pgGSSENCRequest     = 80877104
	pgEncryptionRequest = -1 // what message.code returns for either

	mysqlClientCompress = 0x20
	mysqlClientSSL      = 0x800
)

// headMax is how much of a message's body a framer keeps: enough for a
// COMMIT, a command tag or an error code.
const headMax = 256

// message is one message of the protocol that ended in a chunk.
type message struct {
	end  int    // offset just past the message in the chunk
	len  int    // the message's bytes, header included
	typ  byte   // PostgreSQL's type byte; 0 for the untyped startup messages
	head []byte // the body's first bytes, at most headMax
	size int    // the body's bytes
	// commit: a client's command that commits the transaction.
	commit bool
	// handshake: MySQL's handshake response, the client's first packet.
	handshake bool
}

// code is the request code of an untyped PostgreSQL message,
// pgEncryptionRequest for a request for TLS or GSS encryption.
func (m message) code() int {
	if len(m.head) < 4 {
		return 0
	}
	code := int(binary.BigEndian.Uint32(m.head))
	if code == pgSSLRequest || code == pgGSSENCRequest {
		return pgEncryptionRequest
	}
	return code
}

// capabilities are the client's capability flags of MySQL's handshake
// response.
func (m message) capabilities() uint32 {
	if len(m.head) < 4 {
		return 0
	}
	return binary.LittleEndian.Uint32(m.head)
}

// framer splits one direction of a connection into the protocol's
// messages, whatever the reads' boundaries.
type framer struct {
	wire   Wire
	client bool // the client's direction
	typed  bool // PostgreSQL: past the untyped startup messages
	count  int  // messages ended so far
	cont   bool // MySQL: the packet continues a payload of the previous one

	hdr  [5]byte
	nhdr int    // header bytes read of the current message
	seq  byte   // MySQL: the current packet's sequence number
	left int    // body bytes not read yet of the current message
	size int    // the current message's body bytes
	head []byte // the current message's first body bytes
}

func newFramer(wire Wire, client bool) *framer {
	// The server's side of PostgreSQL is typed from its first byte: the
	// proxy answers the only untyped replies, to encryption requests.
	return &framer{wire: wire, client: client, typed: wire == MySQLWire || !client}
}

func (f *framer) hdrLen() int {
	switch {
	case f.wire == MySQLWire:
		return 4 // 3 bytes of length, little-endian, and the sequence number
	case f.typed:
		return 5 // the type and 4 bytes of length, big-endian, counting themselves
	}
	return 4 // 4 bytes of length
}

// feed reads b, the next bytes of the direction, and returns the messages
// that ended in it.
func (f *framer) feed(b []byte) ([]message, error) {
	var out []message
	for i := 0; i < len(b); {
		hl := f.hdrLen()
		if f.nhdr < hl {
			n := copy(f.hdr[f.nhdr:hl], b[i:])
			f.nhdr += n
			i += n
			if f.nhdr < hl {
				break
			}
			if err := f.begin(); err != nil {
				return out, err
			}
		}
		n := min(f.left, len(b)-i)
		if keep := min(n, headMax-len(f.head)); keep > 0 {
			f.head = append(f.head, b[i:i+keep]...)
		}
		f.left -= n
		i += n
		if f.left == 0 {
			out = append(out, f.end(i))
		}
	}
	return out, nil
}

// begin starts a message whose header was read.
func (f *framer) begin() error {
	f.head = f.head[:0]
	switch {
	case f.wire == MySQLWire:
		f.size = int(f.hdr[0]) | int(f.hdr[1])<<8 | int(f.hdr[2])<<16
		f.seq = f.hdr[3]
	case f.typed:
		f.size = int(int32(binary.BigEndian.Uint32(f.hdr[1:5]))) - 4
	default:
		f.size = int(int32(binary.BigEndian.Uint32(f.hdr[0:4]))) - 4
	}
	if f.size < 0 {
		return fmt.Errorf("malformed message: length %d", f.size+4)
	}
	f.left = f.size
	return nil
}

// end finishes the current message, which ended at offset i of the chunk.
func (f *framer) end(i int) message {
	hl := f.hdrLen()
	m := message{end: i, len: hl + f.size, head: append([]byte(nil), f.head...), size: f.size}
	switch {
	case f.wire == MySQLWire:
		// A command starts a sequence at 0 and fits one packet; a packet of
		// the largest size is continued by the next one.
		m.handshake = f.client && f.count == 0
		m.commit = f.client && !f.cont && f.seq == 0 && f.size < headMax &&
			len(m.head) > 0 && m.head[0] == 0x03 && isCommit(string(m.head[1:]))
		f.cont = f.size == 1<<24-1
	case f.typed:
		m.typ = f.hdr[0]
		// A simple Query: the text and a zero byte.
		m.commit = f.client && m.typ == 'Q' && f.size < headMax &&
			len(m.head) > 0 && m.head[len(m.head)-1] == 0 && isCommit(string(m.head[:len(m.head)-1]))
	default:
		// A startup message: after it the client's messages are typed,
		// unless it asked for encryption, which the proxy declines, and
		// the startup message comes next.
		f.typed = m.code() != pgEncryptionRequest
	}
	f.nhdr = 0
	f.count++
	return m
}

// isCommit reports whether query commits the transaction: COMMIT, COMMIT
// WORK or COMMIT TRANSACTION, or PostgreSQL's END, in any case, with an
// optional semicolon.
func isCommit(query string) bool {
	w := strings.Fields(strings.ToLower(strings.TrimSuffix(strings.TrimSpace(query), ";")))
	if len(w) == 0 || len(w) > 2 || w[0] != "commit" && w[0] != "end" {
		return false
	}
	return len(w) == 1 || w[1] == "work" || w[1] == "transaction"
}
