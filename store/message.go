package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// Message is one stored message. The root package converts its own Message
// to and from this type; store never sees the user's structs.
type Message struct {
	ID         string
	Key        string
	Tags       []string
	Properties map[string]string
	Body       []byte
	Timestamp  int64 // producer's time, unix nanoseconds
	DeliverAt  int64 // unix ns: not delivered before this time; 0: at once
	StoredAt   int64 // unix ns, set by the writer when the message enters the log

	// ReconsumeTimes counts earlier delivery attempts; it is carried by
	// messages re-sent to retry and dead-letter topics.
	ReconsumeTimes int32

	// Offset is the message's position in its partition. It is the log key,
	// not part of the encoded record.
	Offset uint64

	// FreshID is an input of OpAppend and OpCommitTx, set by a sender that
	// generated ID for this very send: no earlier copy can exist, so the
	// dedup lookup is skipped, though the ID is still indexed for later
	// resends.
	// It travels with the command, so every replica skips the same
	// lookups. Not stored.
	FreshID bool
}

// Size is the number of bytes a message counts for against memory and flow
// limits: its strings and body plus a fixed overhead.
func (m *Message) Size() int {
	n := len(m.ID) + len(m.Key) + len(m.Body) + 32
	for _, t := range m.Tags {
		n += len(t)
	}
	for k, v := range m.Properties {
		n += len(k) + len(v)
	}
	return n
}

// recordBound is at least the encoded length of m's record: CRC, then each
// field with its largest msgpack header.
func (m *Message) recordBound() int {
	n := crcLen + 5 + 2 + 5 + len(m.ID) + 5 + len(m.Key) + 5 + 5 + 5 + len(m.Body) + 3*9 + 5
	for _, t := range m.Tags {
		n += 5 + len(t)
	}
	for k, v := range m.Properties {
		n += 10 + len(k) + len(v)
	}
	return n
}

// Record layout (value of the log, delay and half buckets):
//
//	crc32c uint32 big-endian over (key || payload)
//	payload: msgpack array [recordVersion, ID, Key, Tags, Properties, Body,
//	         Timestamp, DeliverAt, StoredAt, ReconsumeTimes]
//
// bbolt checksums only its meta pages, so every record carries its own CRC:
// a flipped byte is reported as ErrCorrupt instead of decoding into wrong data.
const (
	recordVersion = 1
	recordFields  = 10
	crcLen        = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendRecord appends the record of m stored under key.
func appendRecord(dst, key []byte, m *Message) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = appendMessage(dst, m)
	crc := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, dst[start+crcLen:])
	binary.BigEndian.PutUint32(dst[start:], crc)
	return dst
}

// appendMessage appends m's record payload, the msgpack array.
func appendMessage(dst []byte, m *Message) []byte {
	dst = mpArrayLen(dst, recordFields)
	dst = mpUint8(dst, recordVersion)
	dst = mpString(dst, m.ID)
	dst = mpString(dst, m.Key)
	dst = mpArrayLen(dst, len(m.Tags))
	for _, t := range m.Tags {
		dst = mpString(dst, t)
	}
	dst = mpMapLen(dst, len(m.Properties))
	for k, v := range m.Properties {
		dst = mpString(dst, k)
		dst = mpString(dst, v)
	}
	dst = mpBytes(dst, m.Body)
	dst = mpInt64(dst, m.Timestamp)
	dst = mpInt64(dst, m.DeliverAt)
	dst = mpInt64(dst, m.StoredAt)
	return mpInt32(dst, m.ReconsumeTimes)
}

// AppendMessage appends m's record payload to dst: every stored field but
// Offset, which is the log key, and FreshID, a command's input, in the
// record layout above without its CRC. Another node decodes it with
// DecodeMessage.
func AppendMessage(dst []byte, m *Message) []byte { return appendMessage(dst, m) }

// DecodeMessage decodes a payload written by AppendMessage, all of b, into
// m; Offset is left as it was and FreshID false. Body is a copy. Malformed
// input returns an error wrapping ErrCorrupt; nothing is allocated beyond
// what b's length allows.
func DecodeMessage(b []byte, m *Message) error {
	if err := decodeMessagePayload(b, m, false); err != nil {
		return fmt.Errorf("%w: message: %v", ErrCorrupt, err)
	}
	return nil
}

// decodeRecord checks the CRC of value, stored under key, and decodes it.
// Every field of m is set; Body is a copy.
func decodeRecord(key, value []byte, m *Message) error {
	if len(value) < crcLen {
		return fmt.Errorf("%w: record of %d bytes", ErrCorrupt, len(value))
	}
	want := binary.BigEndian.Uint32(value)
	got := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, value[crcLen:])
	if want != got {
		return fmt.Errorf("%w: crc %08x, want %08x", ErrCorrupt, got, want)
	}
	if err := decodeMessagePayload(value[crcLen:], m, false); err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return nil
}

// decodeMessagePayload decodes a record payload, all of b. m.Body is a copy,
// or with alias a slice of b, for a command decoded to be applied: the
// writer copies the message into its batch, and clones the command before
// it could outlive the call.
func decodeMessagePayload(b []byte, m *Message, alias bool) error {
	r := mpReader{b: b}
	if n := r.arrayLen(); r.err == nil && n != recordFields {
		return fmt.Errorf("record has %d fields, want %d", n, recordFields)
	}
	if v := r.int(); r.err == nil && v != recordVersion {
		return fmt.Errorf("record version %d, want %d", v, recordVersion)
	}
	m.ID = r.str()
	m.Key = r.str()
	// Tags and Properties are made once, after their strings were checked
	// to be there: a claimed count costs nothing, and what is there costs
	// its final size, not the copies of growing it. A tag takes one byte at
	// least and a string header 16; a property two, three for every key but
	// one, and a map entry about 40.
	m.Tags = nil
	if nt := r.arrayLen(); nt > 0 && r.strings(nt) {
		m.Tags = make([]string, 0, nt)
		for ; nt > 0 && r.err == nil; nt-- {
			m.Tags = append(m.Tags, r.str())
		}
	}
	m.Properties = nil
	if np := r.mapLen(); np > 0 && r.strings(2*np) {
		m.Properties = make(map[string]string, min(np, len(r.b)/3+1))
		for ; np > 0 && r.err == nil; np-- {
			k := r.str()
			m.Properties[k] = r.str()
		}
	}
	body, isNil := r.raw()
	m.Body = nil
	switch {
	case isNil:
	case alias:
		m.Body = body[:len(body):len(body)]
	default:
		m.Body = bytes.Clone(body)
	}
	if !isNil && m.Body == nil {
		m.Body = []byte{}
	}
	m.Timestamp = r.int()
	m.DeliverAt = r.int()
	m.StoredAt = r.int()
	rt := r.int()
	if rt < math.MinInt32 || rt > math.MaxInt32 {
		return fmt.Errorf("reconsume times %d out of range", rt)
	}
	m.ReconsumeTimes = int32(rt)
	m.FreshID = false
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%d bytes after the record", len(r.b))
	}
	return nil
}
