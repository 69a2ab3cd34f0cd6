package txn

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/store"
)

// Ref names one partition of one topic.
type Ref struct {
	Topic string
	Part  int
}

// txPlan is what committing a transaction does: per partition, the outbox
// messages to publish with the half messages, nil when only halves.
type txPlan map[Ref][]store.Message

// planOf decodes a host store's record into what committing it does.
func planOf(rec localtx.Record) (txPlan, error) {
	_, halves, err := decodeMarker(rec.TxID, rec.Marker)
	if err != nil {
		return nil, err
	}
	plan := txPlan{}
	for _, h := range halves {
		plan[h] = nil
	}
	for _, b := range rec.Outbox {
		ref, msg, err := decodeOutboxRow(rec.TxID, b)
		if err != nil {
			return nil, err
		}
		plan[ref] = append(plan[ref], msg)
	}
	return plan, nil
}

// The marker and outbox rows the node writes through LocalTx.Put live in the
// host's store, maybe longer than this build: each starts with a magic and
// a version. These are the layouts written, where n is a uvarint, str a
// uvarint length and that many bytes, and i64 8 bytes big-endian:
//
//	marker:     "ZMQM" 3 owner:str count:n {topic:str partition:n}...
//	            (the node that wrote it, "" for a standalone node; the
//	            partitions holding half messages)
//	outbox row: "ZMQO" 2 topic:str partition:n id:str key:str
//	            tags:n {tag:str}... properties:n {key:str value:str}...
//	            body:str timestamp:i64 deliverAt:i64
//
// with properties in key order. A version 2 marker is version 3 without the
// owner: any node publishes it. Version 1 rows, which have no magic, are
// msgpack arrays whose first element is 1, markerV1 and outboxRowV1; they
// are still read. Anything else is ErrCorrupt.
const (
	txMarkerMagic  = "ZMQM"
	txOutboxMagic  = "ZMQO"
	txMarkerFormat = 3 // the marker version written
	txOutboxFormat = 2 // the outbox version written; the marker's before owners
	txFormatV1     = 1 // msgpack arrays, read only
)

// encodeMarker is the marker of a transaction of node owner, "" for a
// standalone node, with half messages in halves.
func encodeMarker(owner string, halves []Ref) []byte {
	b := append([]byte(txMarkerMagic), txMarkerFormat)
	b = appendStr(b, owner)
	b = binary.AppendUvarint(b, uint64(len(halves)))
	for _, h := range halves {
		b = appendStr(b, h.Topic)
		b = binary.AppendUvarint(b, uint64(h.Part))
	}
	return b
}

func encodeOutboxRow(ref Ref, m *store.Message) []byte {
	b := append([]byte(txOutboxMagic), txOutboxFormat)
	b = appendStr(b, ref.Topic)
	b = binary.AppendUvarint(b, uint64(ref.Part))
	b = appendStr(b, m.ID)
	b = appendStr(b, m.Key)
	b = binary.AppendUvarint(b, uint64(len(m.Tags)))
	for _, t := range m.Tags {
		b = appendStr(b, t)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Properties)))
	for _, k := range slices.Sorted(maps.Keys(m.Properties)) {
		b = appendStr(b, k)
		b = appendStr(b, m.Properties[k])
	}
	b = binary.AppendUvarint(b, uint64(len(m.Body)))
	b = append(b, m.Body...)
	b = binary.BigEndian.AppendUint64(b, uint64(m.Timestamp))
	return binary.BigEndian.AppendUint64(b, uint64(m.DeliverAt))
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// markerV1 and outboxRowV1 are the version 1 rows.
type markerV1 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	V        int
	Halves   []partRefV1
}

type partRefV1 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic    string
	Part     int
}

type outboxRowV1 struct {
	_msgpack   struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	V          int
	Topic      string
	Part       int
	ID         string
	Key        string
	Tags       []string
	Properties map[string]string
	Body       []byte
	Timestamp  int64
	DeliverAt  int64
}

// decodeMarker returns the owner of the marker b of txid, "" when any node
// may publish it, and the partitions it lists.
func decodeMarker(txid string, b []byte) (owner string, halves []Ref, err error) {
	what := "marker of " + txid
	r, version, err := openRow(what, txMarkerMagic, b, txMarkerFormat, txOutboxFormat)
	if err != nil {
		return "", nil, err
	}
	if r == nil {
		var mk markerV1
		if err := decodeV1(what, b, &mk, &mk.V); err != nil {
			return "", nil, err
		}
		halves := make([]Ref, len(mk.Halves))
		for i, h := range mk.Halves {
			if err := checkPartV1(what, h.Part); err != nil {
				return "", nil, err
			}
			halves[i] = Ref{Topic: h.Topic, Part: h.Part}
		}
		return "", halves, nil
	}
	if version == txMarkerFormat {
		owner = r.str()
	}
	halves = make([]Ref, r.count())
	for i := range halves {
		halves[i].Topic = r.str()
		halves[i].Part = r.part()
	}
	return owner, halves, r.end(what)
}

// checkPartV1 holds a version 1 row's partition to the range rowReader.part
// accepts, so what decodes in version 1 also decodes once written again.
func checkPartV1(what string, p int) error {
	if p < 0 || p > math.MaxInt32 {
		return fmt.Errorf("%w: %s: partition %d", ErrCorrupt, what, p)
	}
	return nil
}

// decodeOutboxRow returns the partition and message of the outbox row b of
// txid.
func decodeOutboxRow(txid string, b []byte) (Ref, store.Message, error) {
	what := "outbox of " + txid
	r, _, err := openRow(what, txOutboxMagic, b, txOutboxFormat)
	if err != nil {
		return Ref{}, store.Message{}, err
	}
	if r == nil {
		var o outboxRowV1
		if err := decodeV1(what, b, &o, &o.V); err != nil {
			return Ref{}, store.Message{}, err
		}
		if err := checkPartV1(what, o.Part); err != nil {
			return Ref{}, store.Message{}, err
		}
		m := store.Message{ID: o.ID, Key: o.Key, Timestamp: o.Timestamp, DeliverAt: o.DeliverAt}
		if len(o.Tags) > 0 {
			m.Tags = o.Tags
		}
		if len(o.Properties) > 0 {
			m.Properties = o.Properties
		}
		if len(o.Body) > 0 {
			m.Body = o.Body
		}
		return Ref{Topic: o.Topic, Part: o.Part}, m, nil
	}
	var (
		ref Ref
		m   store.Message
	)
	ref.Topic = r.str()
	ref.Part = r.part()
	m.ID = r.str()
	m.Key = r.str()
	if n := r.count(); n > 0 {
		m.Tags = make([]string, n)
		for i := range m.Tags {
			m.Tags[i] = r.str()
		}
	}
	if n := r.count(); n > 0 {
		m.Properties = make(map[string]string, n)
		for range n {
			k := r.str()
			m.Properties[k] = r.str()
		}
	}
	if body := r.bytes(); len(body) > 0 {
		m.Body = bytes.Clone(body)
	}
	m.Timestamp = r.int64()
	m.DeliverAt = r.int64()
	return ref, m, r.end(what)
}

// openRow checks the magic and version of row b, named what in errors,
// against the versions read, the one written first. It returns a reader of
// the fields after the version and the version, or nil for a row without
// the magic, which may be of version 1.
func openRow(what, magic string, b []byte, versions ...byte) (*rowReader, byte, error) {
	rest, ok := bytes.CutPrefix(b, []byte(magic))
	if !ok {
		return nil, 0, nil
	}
	if len(rest) == 0 {
		return nil, 0, fmt.Errorf("%w: %s: no format version after the magic", ErrCorrupt, what)
	}
	if !bytes.Contains(versions, rest[:1]) {
		return nil, 0, unknownFormat(what, int(rest[0]))
	}
	return &rowReader{b: rest[1:]}, rest[0], nil
}

// decodeV1 decodes the version 1 row b into v, whose version field is ver.
func decodeV1(what string, b []byte, v any, ver *int) error {
	if err := wire.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: neither magic nor a version 1 row: %v", ErrCorrupt, what, err)
	}
	if *ver != txFormatV1 {
		return unknownFormat(what, *ver)
	}
	return nil
}

func unknownFormat(what string, v int) error {
	return fmt.Errorf("%w: %s: format version %d, unknown to this build", ErrCorrupt, what, v)
}

// rowReader reads the fields of a row after its version. The first error sticks and
// later reads return zero values.
type rowReader struct {
	b   []byte
	err error
}

func (r *rowReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
	r.b = nil
}

func (r *rowReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong number")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a number of items, each at least one byte long.
func (r *rowReader) count() int {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail("%d items in %d bytes", n, len(r.b))
		return 0
	}
	return int(n)
}

func (r *rowReader) part() int {
	p := r.uvarint()
	if p > math.MaxInt32 {
		r.fail("partition %d", p)
		return 0
	}
	return int(p)
}

func (r *rowReader) bytes() []byte {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail("%d bytes wanted, %d left", n, len(r.b))
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *rowReader) str() string { return string(r.bytes()) }

func (r *rowReader) int64() int64 {
	if len(r.b) < 8 {
		r.fail("truncated number")
		return 0
	}
	v := int64(binary.BigEndian.Uint64(r.b))
	r.b = r.b[8:]
	return v
}

// end reports the first error, or bytes left after the last field.
func (r *rowReader) end(what string) error {
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d bytes after the last field", len(r.b))
	}
	if r.err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, what, r.err)
	}
	return nil
}
