package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/vmihailenco/msgpack/v5"
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
	DeliverAt  int64 // not delivered before this time (unix ns); 0: at once
	StoredAt   int64 // set by the writer when the message enters the log (unix ns)

	// ReconsumeTimes counts earlier delivery attempts; it is carried by
	// messages re-sent to retry and dead-letter topics.
	ReconsumeTimes int32

	// Offset is the message's position in its partition. It is the log key,
	// not part of the encoded record.
	Offset uint64

	// NewID, set by a sender that generated ID just now, says no earlier
	// copy can exist: the WAL fast path skips the dedup lookup (the ID is
	// still indexed for later resends). Not stored.
	NewID bool
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

// encoder appends records to one growing arena, reused from batch to batch,
// so the writer allocates nothing per message once warmed up.
type encoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

func newEncoder() *encoder {
	e := &encoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// maxArena is the arena capacity kept between batches; a larger one, grown
// by a burst of big batches, is dropped so an idle partition does not hold it.
const maxArena = 4 << 20

func (e *encoder) reset() {
	if e.buf.Cap() > maxArena {
		e.buf = bytes.Buffer{}
		e.enc.Reset(&e.buf)
		return
	}
	e.buf.Reset()
}

// record encodes m after key and returns the finished value. The returned
// slice stays valid until reset: a later append may move the arena, but the
// old backing array is left untouched.
func (e *encoder) record(key []byte, m *Message) ([]byte, error) {
	start := e.buf.Len()
	e.buf.Write([]byte{0, 0, 0, 0})
	if err := encodeMessage(e.enc, m); err != nil {
		return nil, err
	}
	b := e.buf.Bytes()[start:]
	crc := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, b[crcLen:])
	binary.BigEndian.PutUint32(b, crc)
	return b, nil
}

// bytes copies b into the arena, for keys that must live until commit.
func (e *encoder) bytes(b []byte) []byte {
	start := e.buf.Len()
	e.buf.Write(b)
	return e.buf.Bytes()[start:]
}

// str copies s into the arena, like bytes without converting s first.
func (e *encoder) str(s string) []byte {
	start := e.buf.Len()
	e.buf.WriteString(s)
	return e.buf.Bytes()[start:]
}

func encodeMessage(enc *msgpack.Encoder, m *Message) error {
	_ = enc.EncodeArrayLen(recordFields)
	_ = enc.EncodeUint8(recordVersion)
	_ = enc.EncodeString(m.ID)
	_ = enc.EncodeString(m.Key)
	_ = enc.EncodeArrayLen(len(m.Tags))
	for _, t := range m.Tags {
		_ = enc.EncodeString(t)
	}
	_ = enc.EncodeMapLen(len(m.Properties))
	for k, v := range m.Properties {
		_ = enc.EncodeString(k)
		_ = enc.EncodeString(v)
	}
	_ = enc.EncodeBytes(m.Body)
	_ = enc.EncodeInt64(m.Timestamp)
	_ = enc.EncodeInt64(m.DeliverAt)
	_ = enc.EncodeInt64(m.StoredAt)
	return enc.EncodeInt32(m.ReconsumeTimes)
}

// decodeRecord checks the CRC of value (stored under key) and decodes it.
func decodeRecord(key, value []byte, m *Message) error {
	if len(value) < crcLen {
		return fmt.Errorf("%w: record of %d bytes", ErrCorrupt, len(value))
	}
	want := binary.BigEndian.Uint32(value)
	got := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, value[crcLen:])
	if want != got {
		return fmt.Errorf("%w: crc %08x, want %08x", ErrCorrupt, got, want)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(value[crcLen:]))
	if err := decodeMessage(dec, m); err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return nil
}

func decodeMessage(dec *msgpack.Decoder, m *Message) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n != recordFields {
		return fmt.Errorf("record has %d fields, want %d", n, recordFields)
	}
	v, err := dec.DecodeUint8()
	if err != nil {
		return err
	}
	if v != recordVersion {
		return fmt.Errorf("record version %d, want %d", v, recordVersion)
	}
	if m.ID, err = dec.DecodeString(); err != nil {
		return err
	}
	if m.Key, err = dec.DecodeString(); err != nil {
		return err
	}
	nt, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	m.Tags = nil
	if nt > 0 {
		m.Tags = make([]string, nt)
		for i := range m.Tags {
			if m.Tags[i], err = dec.DecodeString(); err != nil {
				return err
			}
		}
	}
	np, err := dec.DecodeMapLen()
	if err != nil {
		return err
	}
	m.Properties = nil
	if np > 0 {
		m.Properties = make(map[string]string, np)
		for i := 0; i < np; i++ {
			k, err := dec.DecodeString()
			if err != nil {
				return err
			}
			if m.Properties[k], err = dec.DecodeString(); err != nil {
				return err
			}
		}
	}
	if m.Body, err = dec.DecodeBytes(); err != nil {
		return err
	}
	if m.Timestamp, err = dec.DecodeInt64(); err != nil {
		return err
	}
	if m.DeliverAt, err = dec.DecodeInt64(); err != nil {
		return err
	}
	if m.StoredAt, err = dec.DecodeInt64(); err != nil {
		return err
	}
	m.ReconsumeTimes, err = dec.DecodeInt32()
	return err
}
