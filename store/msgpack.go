package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The record payload of message.go is msgpack. These are the few msgpack
// forms it uses, appended to a byte slice and read from one without
// reflection: the writer allocates nothing per message, and every length read
// is checked against the bytes left before anything is allocated.

func mpArrayLen(b []byte, n int) []byte { return mpLen(b, n, 0x90, 0xdc, 0xdd) }
func mpMapLen(b []byte, n int) []byte   { return mpLen(b, n, 0x80, 0xde, 0xdf) }

// mpLen appends an array or map header: fix|n, or a 16- or 32-bit count.
func mpLen(b []byte, n int, fix, c16, c32 byte) []byte {
	switch {
	case n < 16:
		return append(b, fix|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, c16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, c32), uint32(n))
}

func mpString(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func mpBytes(b []byte, v []byte) []byte {
	n := len(v)
	switch {
	case v == nil:
		return append(b, 0xc0)
	case n <= math.MaxUint8:
		b = append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
	return append(b, v...)
}

func mpUint8(b []byte, v uint8) []byte { return append(b, 0xcc, v) }

func mpInt32(b []byte, v int32) []byte {
	return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
}

func mpInt64(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

// mpReader reads msgpack values from b; the first error sticks.
type mpReader struct {
	b   []byte
	err error
}

var errMsgpack = errors.New("bad msgpack")

func (r *mpReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{errMsgpack}, args...)...)
	}
}

func (r *mpReader) code() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.fail("short")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *mpReader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail("length %d with %d bytes left", n, len(r.b))
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *mpReader) uint(size int) uint64 {
	p := r.take(uint64(size))
	if p == nil {
		return 0
	}
	switch size {
	case 1:
		return uint64(p[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(p))
	case 4:
		return uint64(binary.BigEndian.Uint32(p))
	}
	return binary.BigEndian.Uint64(p)
}

// length reads an array or map header; nil counts as 0. Each element takes
// at least one byte, so a count larger than the bytes left is refused.
func (r *mpReader) length(fix, fixMask, c16, c32 byte) int {
	c := r.code()
	var n uint64
	switch {
	case r.err != nil:
		return 0
	case c == 0xc0:
		return 0
	case c&^fixMask == fix:
		n = uint64(c & fixMask)
	case c == c16:
		n = r.uint(2)
	case c == c32:
		n = r.uint(4)
	default:
		r.fail("code %#x, want a length", c)
		return 0
	}
	if n > uint64(len(r.b)) {
		r.fail("%d elements with %d bytes left", n, len(r.b))
		return 0
	}
	return int(n)
}

func (r *mpReader) arrayLen() int { return r.length(0x90, 0x0f, 0xdc, 0xdd) }
func (r *mpReader) mapLen() int   { return r.length(0x80, 0x0f, 0xde, 0xdf) }

// strings reports whether n strings follow, reading none of them; if not,
// it fails r with the error reading them would.
func (r *mpReader) strings(n int) bool {
	probe := *r
	for ; n > 0 && probe.err == nil; n-- {
		probe.raw()
	}
	r.err = probe.err
	return r.err == nil
}

// raw reads a string or binary value; nil is empty, with isNil true.
func (r *mpReader) raw() (v []byte, isNil bool) {
	c := r.code()
	var n uint64
	switch {
	case r.err != nil:
		return nil, false
	case c == 0xc0:
		return nil, true
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n = r.uint(1)
	case c == 0xda || c == 0xc5:
		n = r.uint(2)
	case c == 0xdb || c == 0xc6:
		n = r.uint(4)
	default:
		r.fail("code %#x, want a string", c)
		return nil, false
	}
	return r.take(n), false
}

func (r *mpReader) str() string {
	v, _ := r.raw()
	return string(v)
}

// int reads any msgpack integer into an int64.
func (r *mpReader) int() int64 {
	c := r.code()
	switch {
	case r.err != nil:
		return 0
	case c <= 0x7f:
		return int64(c)
	case c >= 0xe0:
		return int64(int8(c))
	case c == 0xcc:
		return int64(r.uint(1))
	case c == 0xcd:
		return int64(r.uint(2))
	case c == 0xce:
		return int64(r.uint(4))
	case c == 0xcf:
		v := r.uint(8)
		if v > math.MaxInt64 {
			r.fail("uint64 %d out of range", v)
		}
		return int64(v)
	case c == 0xd0:
		return int64(int8(r.uint(1)))
	case c == 0xd1:
		return int64(int16(r.uint(2)))
	case c == 0xd2:
		return int64(int32(r.uint(4)))
	case c == 0xd3:
		return int64(r.uint(8))
	}
	r.fail("code %#x, want an integer", c)
	return 0
}
