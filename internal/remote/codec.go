package remote

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/zeze-go/mq/store"
)

// The partition service's payloads are hand-written layouts: a version byte
// first, then fields in a fixed order, integers as (zigzag) uvarints and
// strings as a uvarint length and bytes. Every request starts with
//
//	version uint8 (payloadVersion)
//	topic   string
//	index   uvarint (< 2^31)
//
// and every reply with the version byte; the rest of each is described
// with the ops, in ops.go.
const payloadVersion = 1

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, 1)
	}
	return append(dst, 0)
}

var errShort = errors.New("short payload")

// decoder reads the layouts of this package from b; the first error sticks
// and every later read returns zero values. Lengths are checked against the
// bytes left before anything is allocated.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// int reads a uvarint that must fit an int32.
func (d *decoder) int() int {
	v := d.uvarint()
	if v > math.MaxInt32 {
		d.fail(fmt.Errorf("count %d out of range", v))
		return 0
	}
	return int(v)
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail(errShort)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) bool() bool {
	switch d.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail(errors.New("bad bool"))
	return false
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail(errShort)
		return nil
	}
	out := d.b[:n:n]
	d.b = d.b[n:]
	return out
}

// count reads a count of elements taking at least min bytes each, refusing
// one above most (at least 0) or that the bytes left cannot hold, before
// anything is allocated for them.
func (d *decoder) count(min, most int) int {
	n := d.uvarint()
	switch {
	case d.err != nil:
	case n > uint64(most):
		d.fail(fmt.Errorf("%d elements, limit %d", n, most))
	case n > uint64(len(d.b)/min):
		d.fail(fmt.Errorf("%d elements in %d bytes", n, len(d.b)))
	default:
		return int(n)
	}
	return 0
}

// str reads a string of at most max bytes.
func (d *decoder) str(max int) string {
	b := d.bytes()
	if len(b) > max {
		d.fail(fmt.Errorf("string of %d bytes, max %d", len(b), max))
		return ""
	}
	return string(b)
}

// version reads and checks the version byte.
func (d *decoder) version() {
	if v := d.byte(); d.err == nil && v != payloadVersion {
		d.fail(fmt.Errorf("payload version %d, want %d", v, payloadVersion))
	}
}

// finish returns the first error, or one for bytes left over, wrapping
// ErrProtocol; what, a request or a reply, and op name the payload.
func (d *decoder) finish(what string, op uint16) error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d bytes after the payload", len(d.b))
	}
	if d.err != nil {
		return fmt.Errorf("%w: %s of op %d: %v", ErrProtocol, what, op, d.err)
	}
	return nil
}

// maxTopicBytes bounds a topic name in a request.
const maxTopicBytes = 1024

// Stats: low, next uvarint; bytes, delayed, last stored varint.
func appendStats(dst []byte, s store.Stats) []byte {
	dst = binary.AppendUvarint(dst, s.Low)
	dst = binary.AppendUvarint(dst, s.Next)
	dst = binary.AppendVarint(dst, s.Bytes)
	dst = binary.AppendVarint(dst, s.Delayed)
	return binary.AppendVarint(dst, s.LastStored)
}

func (d *decoder) stats() store.Stats {
	return store.Stats{Low: d.uvarint(), Next: d.uvarint(), Bytes: d.varint(), Delayed: d.varint(), LastStored: d.varint()}
}

// Result: acks count, each offset uvarint + flags (1 delayed, 2 duplicate);
// count uvarint; flags (1 more, 2 found); previous uint8; offset,
// generation uvarint.
func appendResult(dst []byte, r *store.Result) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(r.Acks)))
	for _, a := range r.Acks {
		dst = append(binary.AppendUvarint(dst, a.Offset), flags(a.Delayed, a.Duplicate))
	}
	dst = binary.AppendUvarint(dst, uint64(max(r.Count, 0)))
	dst = append(dst, flags(r.More, r.Found), byte(r.Previous))
	dst = binary.AppendUvarint(dst, r.Offset)
	return binary.AppendUvarint(dst, r.Generation)
}

// result reads a Result of at most most acks.
func (d *decoder) result(most int) store.Result {
	var r store.Result
	n := d.count(minAckBytes, most)
	if n > 0 {
		r.Acks = make([]store.Ack, 0, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		off := d.uvarint()
		delayed, dup := d.flags("ack")
		r.Acks = append(r.Acks, store.Ack{Offset: off, Delayed: delayed, Duplicate: dup})
	}
	r.Count = d.int()
	r.More, r.Found = d.flags("result")
	r.Previous = store.Decision(d.byte())
	if r.Previous > store.RolledBack {
		d.fail(fmt.Errorf("decision %d", r.Previous))
	}
	r.Offset = d.uvarint()
	r.Generation = d.uvarint()
	return r
}

// GroupState: offset, generation uvarint; updated varint; flags byte (1:
// Reset, 2: Released); lease varint.
func appendGroup(dst []byte, g store.GroupState) []byte {
	dst = binary.AppendUvarint(dst, g.Offset)
	dst = binary.AppendUvarint(dst, g.Generation)
	dst = binary.AppendVarint(dst, g.Updated)
	dst = append(dst, flags(g.Reset, g.Released))
	return binary.AppendVarint(dst, g.Lease)
}

// flags is the byte of two flags: 1 for a, 2 for b.
func flags(a, b bool) byte {
	var f byte
	if a {
		f |= 1
	}
	if b {
		f |= 2
	}
	return f
}

// flags reads a flags byte of what, as the function flags makes it.
func (d *decoder) flags(what string) (a, b bool) {
	f := d.byte()
	if f > 3 {
		d.fail(fmt.Errorf("%s flags %#x", what, f))
	}
	return f&1 != 0, f&2 != 0
}

func (d *decoder) group() store.GroupState {
	g := store.GroupState{Offset: d.uvarint(), Generation: d.uvarint(), Updated: d.varint()}
	g.Reset, g.Released = d.flags("group")
	if g.Lease = d.varint(); g.Lease < 0 {
		d.fail(fmt.Errorf("group lease %d", g.Lease))
	}
	return g
}

// Message: offset uvarint, then the record payload (store.AppendMessage)
// as a uvarint length and bytes.
func appendMessage(dst []byte, m *store.Message) []byte {
	dst = binary.AppendUvarint(dst, m.Offset)
	start := len(dst)
	dst = append(dst, make([]byte, binary.MaxVarintLen32)...) // the length, filled below
	body := len(dst)
	dst = store.AppendMessage(dst, m)
	var l [binary.MaxVarintLen32]byte
	n := binary.PutUvarint(l[:], uint64(len(dst)-body))
	copy(dst[start:], l[:n])
	return append(dst[:start+n], dst[body:]...)
}

func (d *decoder) message(m *store.Message) {
	off := d.uvarint()
	b := d.bytes()
	if d.err != nil {
		return
	}
	if err := store.DecodeMessage(b, m); err != nil {
		d.fail(err)
		return
	}
	m.Offset = off
}

// embedded error: present bool, then code uint16 BE and message string.
// GroupStates replies carry one beside the good records.
func appendEmbeddedError(dst []byte, err error) []byte {
	if err == nil {
		return append(dst, 0)
	}
	e := appendError(nil, err)
	dst = append(dst, 1)
	return append(binary.AppendUvarint(dst, uint64(len(e))), e...)
}

func (d *decoder) embeddedError() error {
	if !d.bool() {
		return nil
	}
	b := d.bytes()
	if d.err != nil {
		return nil
	}
	e, err := decodeError(b)
	if err != nil {
		d.fail(err)
		return nil
	}
	return e
}
