// Package wire holds the encodings shared by the node's formats: the safe
// decoding of msgpack values, the records of earlier formats, and the
// length-prefixed frames of node-to-node connections.
package wire

import (
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Unmarshal decodes the msgpack value b into v, as msgpack.Unmarshal does,
// but safely for damaged input: the library panics on some malformed input,
// such as a nil where a time is expected, which Unmarshal returns as an
// error.
func Unmarshal(b []byte, v any) (err error) {
	// The library also trusts lengths: an array header claiming 2^32
	// elements makes it allocate them. Walk the bytes first.
	if rest, err := skipMsgpack(b, 0); err != nil {
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
// the value is cut short, nests deeper than 32, or claims more elements or
// bytes than b holds.
func skipMsgpack(b []byte, depth int) ([]byte, error) {
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
	var err error
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return b, nil
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
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
		n = 1 + 1<<(c-0xd4)
	case c == 0xc4 || c == 0xd9:
		n, b, err = size(1)
	case c == 0xc5 || c == 0xda:
		n, b, err = size(2)
	case c == 0xc6 || c == 0xdb:
		n, b, err = size(4)
	case c == 0xc7 || c == 0xc8 || c == 0xc9: // ext 8/16/32: length, type, data
		n, b, err = size(1 << (c - 0xc7))
		n++
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
	b = b[n:]
	for range elems {
		if b, err = skipMsgpack(b, depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}
