// Package wire holds the encodings shared by the node's formats: the safe
// decoding of msgpack values, the records of earlier formats, and the
// length-prefixed frames of node-to-node connections.
package wire

import (
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// ErrOverLimit is returned by UnmarshalLimited for a value with a count or
// a length over its limits.
var ErrOverLimit = errors.New("wire: over the decoder's limit")

// Unmarshal decodes the msgpack value b into v, as msgpack.Unmarshal does,
// but safely for damaged input: the library panics on some malformed input,
// such as a nil where a time is expected, which Unmarshal returns as an
// error. It checks every count against the bytes left only, so it is for
// what this node wrote itself; what a peer sent goes through
// UnmarshalLimited.
func Unmarshal(b []byte, v any) error { return unmarshal(b, v, nil) }

// Limits bound the msgpack value UnmarshalLimited accepts: every array's
// and every map's count at most Elems, every string's, binary's and
// extension's length at most Bytes. A decoder allocates per element far
// more than an element's smallest encoding (a one-byte empty array becomes
// a struct, a one-byte empty string a 16-byte header), so a count checked
// against the bytes alone lets a frame make the receiver allocate many
// times its size; with Elems, what one array costs is bounded by Elems
// times its element's size, a constant of the type.
type Limits struct {
	Elems int
	Bytes int
}

// UnmarshalLimited is Unmarshal for a value a peer sent: it refuses,
// before decoding anything, a value with a count or a length over lim.
func UnmarshalLimited(b []byte, v any, lim Limits) error { return unmarshal(b, v, &lim) }

func unmarshal(b []byte, v any, lim *Limits) (err error) {
	// The library trusts lengths: an array header claiming 2^32 elements
	// makes it allocate them. Walk the bytes first.
	if rest, err := skipMsgpack(b, 0, lim); err != nil {
		return err
	} else if len(rest) != 0 {
		return fmt.Errorf("%d bytes after the value", len(rest))
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed msgpack: %v", r)
		}
	}()
	return msgpack.Unmarshal(b, v)
}

// skipMsgpack returns b after the msgpack value at its start, or an error if
// the value is cut short, nests deeper than 32, claims more elements or
// bytes than b holds, or, unless lim is nil, a count or a length over lim.
func skipMsgpack(b []byte, depth int, lim *Limits) ([]byte, error) {
	errShort := errors.New("short msgpack value")
	if depth > 32 {
		return nil, errors.New("msgpack nested too deep")
	}
	if len(b) == 0 {
		return nil, errShort
	}
	c, b := b[0], b[1:]
	size := func(n int) (uint64, []byte, error) {
		if len(b) < n {
			return 0, nil, errShort
		}
		var v uint64
		for _, x := range b[:n] {
			v = v<<8 | uint64(x)
		}
		return v, b[n:], nil
	}
	var n uint64     // bytes to skip
	var elems uint64 // values to skip (arrays: n, maps: 2n)
	var data uint64  // of n, the data of a string, binary or extension
	var err error
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return b, nil
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
		data = n
	case c&0xf0 == 0x90:
		elems = uint64(c & 0x0f)
	case c&0xf0 == 0x80:
		elems = 2 * uint64(c&0x0f)
	case c == 0xcc || c == 0xd0:
		n = 1
	case c == 0xcd || c == 0xd1:
		n = 2
	case c == 0xca || c == 0xce || c == 0xd2:
		n = 4
	case c == 0xcb || c == 0xcf || c == 0xd3:
		n = 8
	case c == 0xd4 || c == 0xd5 || c == 0xd6 || c == 0xd7 || c == 0xd8: // fixext: type, then 1..16 bytes
		data = 1 << (c - 0xd4)
		n = 1 + data
	case c == 0xc4 || c == 0xd9:
		n, b, err = size(1)
		data = n
	case c == 0xc5 || c == 0xda:
		n, b, err = size(2)
		data = n
	case c == 0xc6 || c == 0xdb:
		n, b, err = size(4)
		data = n
	case c == 0xc7 || c == 0xc8 || c == 0xc9: // ext 8/16/32: length, type, data
		data, b, err = size(1 << (c - 0xc7))
		n = data + 1
	case c == 0xdc:
		elems, b, err = size(2)
	case c == 0xdd:
		elems, b, err = size(4)
	case c == 0xde:
		elems, b, err = size(2)
		elems *= 2
	case c == 0xdf:
		elems, b, err = size(4)
		elems *= 2
	default:
		return nil, fmt.Errorf("msgpack code %#x", c)
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(len(b)) || elems > uint64(len(b)) {
		return nil, errShort
	}
	if lim != nil {
		count := elems
		if c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
			count /= 2 // a map's count is its pairs
		}
		if count > uint64(lim.Elems) {
			return nil, fmt.Errorf("%w: %d elements, limit %d", ErrOverLimit, count, lim.Elems)
		}
		if data > uint64(lim.Bytes) {
			return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrOverLimit, data, lim.Bytes)
		}
	}
	b = b[n:]
	for range elems {
		if b, err = skipMsgpack(b, depth+1, lim); err != nil {
			return nil, err
		}
	}
	return b, nil
}
