package store

import (
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// A gen is the effects of one batch of commands: the bbolt writes they
// produced, in order, and the partition state after them. Commands are
// applied once, by apply.go, against a view of the file with the gens not
// yet in it laid over it; the gen they produce is what the write-ahead log
// stores, what readers see once it is durable, and what the materializer
// writes into the file. Replay after a crash writes the same gens again.
// No code computes a result a second time, so an acknowledgement and the
// file can never disagree.
//
// Effect record (a gen's buf, the payload of its WAL record):
//
//	'Z' 'E' effVersion
//	file id  8 bytes: the partition file's (meta "id"), so that records of an
//	         earlier file of the same stream name are never applied to this one
//	index    uint64 BE, the partition's Applied once the gen is in the file
//	mutations, each:
//	  op     uint8: bucket number << 1, | 1 for a delete
//	  key    uvarint length + bytes
//	  value  (puts only) uint32 BE length + bytes
//	state    stateLen bytes (state.go), the last bytes of the record
//
// Version 1 (before group generations) ends with a state of version 1
// (stateLenV1 bytes); version 3, written only while the partition is
// frozen (OpFreeze), with one of version 3 (stateLenV3); replay reads all
// three. decodeState refuses a state whose
// version does not match its length, so a record's state is never misread.
const (
	effVersion = 2
	effFrozen  = 3
	effHeader  = 3 + 8 + 8
	// effectOverhead bounds the bytes a message adds to a gen besides its
	// record and ID: the log put's op, key and length, and its dedup put.
	effectOverhead = 1 + 1 + 8 + 4 + 1 + 2 + 4 + 16
)

// Bucket numbers of effect records: part of the WAL format.
const (
	bLog = iota
	bHalf
	bTxs
	bGroups
	bDelay
	bDedup
	nBuckets
)

var bucketNames = [nBuckets][]byte{bucketLog, bucketHalf, bucketTxs, bucketGroups, bucketDelay, bucketDedup}

// span locates a value in a gen's buf; del marks a deleted key.
type span struct {
	off, n uint32
	del    bool
}

type gen struct {
	idx  uint64
	buf  []byte
	st   state // the working state while built, then the state after the gen
	base state // the state before the gen

	// Lookups by key in half, txs, groups and dedup: the last write of each key.
	kv [nBuckets]map[string]span
	// The log records appended, at offsets logBase, logBase+1, ...
	logBase uint64
	logs    []span

	minDue   int64 // earliest DeliverAt put in the delay index, if hasDue
	hasDue   bool
	delayDel bool     // deletes delay entries, as OpRelease does
	grew     bool     // adds to the log or the delay index
	bulk     bool     // holds a command of more than bulkMsgs messages
	muts     int      // mutations
	pos      Position // Replicated: the position of the last command applied to it

	// Set by the partition as the gen moves through the log.
	reqs  []*request
	seg   uint64 // WAL segment holding it, 0 for none
	done  bool   // its log write ended, acked or failed
	acked bool   // durable: readers see it, the materializer may write it
	at    time.Time
}

// newGen starts a gen of the file id after state st, with room for about
// size bytes.
func newGen(id [8]byte, st state, size int) *gen {
	g := &gen{st: st, base: st, logBase: st.Next}
	g.buf = append(make([]byte, 0, effHeader+stateLen+max(size, 256)), 'Z', 'E', effVersion)
	g.buf = append(g.buf, id[:]...)
	g.buf = append(g.buf, 0, 0, 0, 0, 0, 0, 0, 0)
	return g
}

// empty reports whether the gen changes nothing: no mutation and no change
// of state. A trim whose pruning finds no dedup entry still advances
// DedupLow, and a replica must end in the same state.
func (g *gen) empty() bool { return g.muts == 0 && g.st == g.base }

// size is the gen's encoded size so far.
func (g *gen) size() int { return len(g.buf) + stateLenV3 }

// finish numbers the gen and appends its state; buf is final afterwards.
func (g *gen) finish(idx uint64) {
	g.idx = idx
	g.st.Applied = idx
	binary.BigEndian.PutUint64(g.buf[11:], idx)
	if g.st.Frozen != 0 {
		g.buf[2] = effFrozen
	}
	g.buf = appendState(g.buf, &g.st)
}

func (g *gen) op(b int, del bool, key []byte) {
	op := byte(b << 1)
	if del {
		op |= 1
	}
	g.buf = append(g.buf, op)
	g.buf = binary.AppendUvarint(g.buf, uint64(len(key)))
	g.buf = append(g.buf, key...)
	g.muts++
}

// value appends a put's value via enc and returns its span.
func (g *gen) value(enc func([]byte) []byte) span {
	at := len(g.buf)
	g.buf = append(g.buf, 0, 0, 0, 0)
	g.buf = enc(g.buf)
	n := len(g.buf) - at - 4
	binary.BigEndian.PutUint32(g.buf[at:], uint32(n))
	return span{off: uint32(at + 4), n: uint32(n)}
}

func (g *gen) remember(b int, key string, s span) {
	if g.kv[b] == nil {
		g.kv[b] = make(map[string]span, max(8, cap(g.buf)/1024))
	}
	g.kv[b][key] = s
}

// put writes val under key in bucket b, which is looked up by key.
func (g *gen) put(b int, key string, val []byte) {
	g.op(b, false, bytesOf(key))
	g.remember(b, key, g.value(func(dst []byte) []byte { return append(dst, val...) }))
}

// putWith is put with the value appended by enc.
func (g *gen) putWith(b int, key string, enc func([]byte) []byte) {
	g.op(b, false, bytesOf(key))
	g.remember(b, key, g.value(enc))
}

// del deletes key from bucket b, which is looked up by key.
func (g *gen) del(b int, key string) {
	g.op(b, true, bytesOf(key))
	g.remember(b, key, span{del: true})
}

// putBin and delBin write the log and delay buckets, read only in key order.
func (g *gen) putBin(b int, key, val []byte) span {
	g.op(b, false, key)
	return g.value(func(dst []byte) []byte { return append(dst, val...) })
}

func (g *gen) delBin(b int, key []byte) { g.op(b, true, key) }

// appendLog puts m's record at offset off, the next one, and returns the
// record's length.
func (g *gen) appendLog(off uint64, m *Message) int {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], off)
	g.op(bLog, false, k[:])
	s := g.value(func(dst []byte) []byte { return appendRecord(dst, k[:], m) })
	g.logs = append(g.logs, s)
	g.grew = true
	return int(s.n)
}

// appendLogRaw puts an already encoded record at offset off, the next one.
func (g *gen) appendLogRaw(off uint64, rec []byte) {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], off)
	g.logs = append(g.logs, g.putBin(bLog, k[:], rec))
	g.grew = true
}

// lookup returns the last write of key in bucket b: found false when the
// gen has none, val nil when it deleted the key.
func (g *gen) lookup(b int, key string) (val []byte, found bool) {
	s, ok := g.kv[b][key]
	if !ok {
		return nil, false
	}
	if s.del {
		return nil, true
	}
	return g.buf[s.off : s.off+s.n : s.off+s.n], true
}

// logRecord returns the record the gen appended at off.
func (g *gen) logRecord(off uint64) ([]byte, bool) {
	if off < g.logBase || off-g.logBase >= uint64(len(g.logs)) {
		return nil, false
	}
	s := g.logs[off-g.logBase]
	return g.buf[s.off : s.off+s.n : s.off+s.n], true
}

// bytesOf returns s's bytes without copying. bbolt and the encoders only
// read them.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// writeEffects writes the mutations of the effect record rec into bks, a
// write transaction's buckets, and returns the record's index and state.
// The values stay in rec, which must outlive the transaction.
func writeEffects(bks *[nBuckets]*bolt.Bucket, rec []byte) (idx uint64, st state, err error) {
	_, idx, muts, st, err := splitEffects(rec)
	if err != nil {
		return 0, st, err
	}
	for len(muts) > 0 {
		op := muts[0]
		b := int(op >> 1)
		if b >= nBuckets || op&^1 != byte(b<<1) {
			return 0, st, fmt.Errorf("%w: effect op %#x", ErrCorrupt, op)
		}
		r := reader{b: muts[1:]}
		key := r.bytes()
		if r.err != nil || len(key) == 0 {
			return 0, st, fmt.Errorf("%w: effect key: %v", ErrCorrupt, r.err)
		}
		if op&1 == 1 {
			err = bks[b].Delete(key)
		} else {
			if len(r.b) < 4 || uint64(binary.BigEndian.Uint32(r.b)) > uint64(len(r.b)-4) {
				return 0, st, fmt.Errorf("%w: effect value", ErrCorrupt)
			}
			n := binary.BigEndian.Uint32(r.b)
			val := r.b[4 : 4+n : 4+n]
			r.b = r.b[4+n:]
			err = bks[b].Put(key, val)
		}
		if err != nil {
			return 0, st, err
		}
		muts = r.b
	}
	return idx, st, nil
}

// splitEffects checks an effect record's frame and returns its file id, its
// index, its mutations and its state.
func splitEffects(rec []byte) (id [8]byte, idx uint64, muts []byte, st state, err error) {
	if len(rec) < 3 || rec[0] != 'Z' || rec[1] != 'E' {
		return id, 0, nil, st, fmt.Errorf("%w: effect record of %d bytes", ErrCorrupt, len(rec))
	}
	n := stateLen
	switch rec[2] {
	case effVersion:
	case effFrozen:
		n = stateLenV3
	case 1:
		n = stateLenV1
	default:
		return id, 0, nil, st, fmt.Errorf("%w: effect record version %d, want 1 to %d", ErrCorrupt, rec[2], effFrozen)
	}
	if len(rec) < effHeader+n {
		return id, 0, nil, st, fmt.Errorf("%w: effect record of %d bytes", ErrCorrupt, len(rec))
	}
	copy(id[:], rec[3:])
	idx = binary.BigEndian.Uint64(rec[11:])
	if err := decodeState(rec[len(rec)-n:], &st); err != nil {
		return id, 0, nil, st, err
	}
	if st.Applied != idx {
		return id, 0, nil, st, fmt.Errorf("%w: effect record %d with state of %d", ErrCorrupt, idx, st.Applied)
	}
	return id, idx, rec[effHeader : len(rec)-n], st, nil
}
