package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/zeze-go/mq/internal/fuzzseed"
)

// Every decoder of stored bytes has a FuzzXxx target here or in
// format_test.go. Each adds its seeds from fuzzSeeds, the same ones
// TestWriteFuzzCorpus writes to testdata/fuzz (the crashers the fuzzer
// found stay there too).

// fuzzSeeds returns the seeds of each target: encodings by the real
// encoders, and edge cases (cut short, lengths claiming more than is there).
func fuzzSeeds() map[string][][]any {
	msg := Message{ID: "id", Key: "k", Tags: []string{"a"}, Properties: map[string]string{"x": "y"}, Body: []byte("body"),
		Timestamp: 1 << 62, DeliverAt: -1, StoredAt: 5, ReconsumeTimes: 2}
	payload := appendMessage(nil, &msg)
	rec := appendRecord(nil, []byte("k"), &msg)
	// A record payload whose field (at its place after version, ID and
	// key) is the given msgpack bytes.
	field := func(b string) []byte { return append([]byte{0x9a, 0xcc, 1, 0xa1, 'a', 0xa0}, b...) }
	huge := []string{"\xdd\xff\xff\xff\xff", "\xdf\xff\xff\xff\xff", "\xdb\xff\xff\xff\xff", "\xc6\xff\xff\xff\xff", "\xdc\xff\xff", "\xde\xff\xff"}

	cmd := AppendCommand(nil, &Command{Op: OpAppend, Now: 1, Msgs: []Message{msg, {ID: "b", FreshID: true}}})
	// A command of one message whose payload is p.
	cmdOf := func(p []byte) []byte {
		b := AppendCommand(nil, &Command{Op: OpAppend, Now: 1})
		b = binary.AppendUvarint(b[:len(b)-1], 1) // one message, not none
		b = binary.AppendUvarint(b, uint64(len(p)))
		return append(append(b, p...), 0)
	}

	st := state{Next: 9, Low: 2, Bytes: 3, DedupLow: 4, Applied: 7, LastStored: 6, DelaySeq: 7, Delayed: 8}
	stb := appendState(nil, &st)
	type v1State struct { // format 1's state: msgpack.Marshal of the Go struct
		Next, Low  uint64
		Bytes      int64
		DedupLow   uint64
		Applied    uint64
		LastStored int64
		DelaySeq   uint64
		Delayed    int64
	}
	v1, _ := msgpack.Marshal(v1State{Next: 2, Bytes: 100, LastStored: 1 << 60, Applied: 3})
	v1low, _ := msgpack.Marshal(map[string]any{"Next": 1, "Low": 2})

	half := appendHalf(nil, &halfTx{Producer: "n", FirstSeen: 1, LastCheck: 3, Checks: 2, Records: [][]byte{rec, {}}})
	type v1Half struct {
		Producer  string   `msgpack:"p"`
		FirstSeen int64    `msgpack:"f"`
		LastCheck int64    `msgpack:"l"`
		Checks    int      `msgpack:"c"`
		Records   [][]byte `msgpack:"r"`
	}
	v1h, _ := msgpack.Marshal(v1Half{Producer: "node", FirstSeen: 1, Checks: 1, Records: [][]byte{rec}})
	v1hNeg, _ := msgpack.Marshal(v1Half{Checks: -1})

	id := [8]byte{'f', 'i', 'l', 'e', 'i', 'd', 0, 1}
	g := newGen(id, st, 0)
	g.appendLog(st.Next, &msg)
	g.put(bDedup, msg.ID, appendSealed(nil, msg.ID, make([]byte, dedupBytes)))
	g.put(bTxs, "tx", appendSealed(nil, "tx", make([]byte, decisionBytes)))
	g.putBin(bDelay, []byte("\x00\x00\x00\x01due"), rec)
	g.del(bHalf, "tx")
	g.delBin(bLog, []byte{0, 0, 0, 0, 0, 0, 0, 1})
	g.finish(8)
	empty := newGen(id, st, 0)
	empty.finish(8)
	// An effect record of index 8 with the mutations m.
	effects := func(m string) []byte {
		b := append(bytes.Clone(empty.buf[:effHeader]), m...)
		s := st
		s.Applied = 8
		return appendState(b, &s)
	}

	v1rec := effectRecordV1(id, state{Next: 1, Bytes: 5, Applied: 8, LastStored: 6}, "g", appendSealed(nil, "g", be.AppendUint64(nil, 7)))
	group := appendGroup(nil, "g", &GroupState{Offset: 1, Generation: 2, Updated: 3})

	seg := []byte(walMagic + "saltsalt")
	seg = appendFrame(seg, append([]byte{frameWrite}, "saltsalt\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x10"...), nil, "")
	seg = appendFrame(seg, nil, []byte("payload"), "s")
	seg = appendFrame(seg, nil, g.buf, "t/0")

	seeds := map[string][][]any{
		"FuzzDecodeRecord": {{payload}, {appendMessage(nil, &Message{})}, {payload[:len(payload)/2]},
			{[]byte{0x9a, 0xcc, 1, 0xa1, 'a', 0xa0, 0xdd, 0xff, 0xff, 0xff, 0xff}}, {[]byte{0x9a, 0xcc, 1, 0xdb, 0xff, 0xff, 0xff, 0xff}}},
		"FuzzDecodeCommand": {{cmd}, {cmd[:len(cmd)-3]},
			{AppendCommand(nil, &Command{Op: OpCommitOffset, Now: 1, Group: "g", Offset: 7})},
			{AppendCommand(nil, &Command{Op: OpTrim, Now: 3, Limit: 10, MaxAge: 11, MaxBytes: 12, DedupTTL: 13, DecideTTL: 14})},
			{[]byte("ZC\x01\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\x0f")},
			{[]byte("ZC\x01\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x05\xdd\xff\xff\xff\xff\x00")},
			// version 1 (no generation, no start), and version 2's group ops
			{[]byte("ZC\x01\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x00\x00\x01g\x00\x00\x00")},
			{AppendCommand(nil, &Command{Op: OpCommitOffset, Now: 1, Group: "g", Offset: 7, Generation: 1<<64 - 1})},
			{AppendCommand(nil, &Command{Op: OpClaim, Now: 1, Group: "g", Offset: 7, Start: StartLast})},
			{AppendCommand(nil, &Command{Op: OpResetOffset, Now: 1, Group: "g", Offset: 7})},
			// a generation of 11 varint bytes, a start of 255, a cut start
			{[]byte("ZC\x02\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00\x01g\x00\x00\x00")},
			{[]byte("ZC\x02\x0a\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x00\x00\x05\xff\x01g\x00\x00\x00")},
			{[]byte("ZC\x02\x0a\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x00\x00\x05")}},
		"FuzzDecodeState": {{stb}, {appendState(nil, &state{})}, {stb[:len(stb)-1]}, {v1}, {v1low}, {v1[:len(v1)-2]},
			{appendStateV1(nil, &st)}, {appendStateV1(nil, &state{})},
			{[]byte("\xdf\xff\xff\xff\xff")}, {[]byte("\x81\xdb\xff\xff\xff\xff")}, {[]byte("\x81\xa4Next\xcf\xff\xff\xff\xff\xff\xff\xff\xff")}},
		"FuzzDecodeHalf": {{half}, {half[:len(half)-1]}, {v1h}, {v1hNeg}, {v1h[:len(v1h)-3]},
			{[]byte{0x85, 0xa1, 'r', 0xdd, 0xff, 0xff, 0xff, 0xff}}, {[]byte("\x81\xa1r\x91\xc6\xff\xff\xff\xff")},
			{append(bytes.Clone(half[:19]), "\x00\x00\xff\xff\xff\xff\x0f"...)}},
		"FuzzUnseal": {{"a", appendSealed(nil, "a", make([]byte, 8)), 0}, {"id", appendSealed(nil, "id", make([]byte, dedupBytes)), 1},
			{"tx", appendSealed(nil, "tx", []byte{1, 0, 0, 0, 0, 0, 0, 0, 9}), 2}, {"tx", []byte{2, 0, 0, 0, 0, 0, 0, 0, 9}, 2},
			{"x", []byte{}, 0}, {"x", []byte("\xff\xff\xff\xff"), 1}, {"g", group, 3}},
		"FuzzDecodeGroup": {{"g", group}, {"g", group[:groupBytes]}, {"g", group[:len(group)-1]}, {"h", group},
			{"g", be.AppendUint64(nil, 7)}, {"g", appendSealed(nil, "g", be.AppendUint64(nil, 7))}, {"g", []byte{}},
			{"g", appendSealed(nil, "g", append([]byte("ZG\x02"), make([]byte, 24)...))}},
		"FuzzEffects": {{g.buf}, {empty.buf}, {g.buf[:len(g.buf)-1]}, {g.buf[:effHeader+3]},
			{effects("\xff\x01k")}, {effects("\x00\xff\xff\xff\xff\x0f")}, {effects("\x00\x01k\xff\xff\xff\xff")},
			{effects("\x0a\x00")}, {effects("\x03\x01k\x02\x01k\x00\x00\x00\x01v")},
			{v1rec}, {v1rec[:len(v1rec)-1]}, {append([]byte("ZE\x02"), v1rec[3:]...)}},
		"FuzzWALSegment": {{seg, 0}, {seg, 1}, {seg[:len(seg)-3], 0}, {[]byte(walMagicV1), 0}, {make([]byte, 64), 0},
			{append([]byte(walMagic+"saltsalt"), "\xff\xff\xff\xff\x00\x00\x00\x00"...), 0}},
	}
	for _, h := range huge {
		seeds["FuzzDecodeRecord"] = append(seeds["FuzzDecodeRecord"], []any{field(h)})
		seeds["FuzzDecodeCommand"] = append(seeds["FuzzDecodeCommand"], []any{cmdOf(field(h))})
	}
	return seeds
}

// TestWriteFuzzCorpus writes the seeds to testdata/fuzz/<target>/ in the
// fuzzer's corpus format, named like the fuzzer names them, so that CI's
// fuzzing starts from them: ZEZE_WRITE_CORPUS=1 go test -run
// TestWriteFuzzCorpus ./store. Files already there are kept.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("ZEZE_WRITE_CORPUS") != "1" {
		t.Skip("ZEZE_WRITE_CORPUS=1 writes the seed corpus")
	}
	fuzzseed.WriteCorpus(t, fuzzSeeds())
}

// FuzzDecodeState: the partition state decoder (both formats) never
// panics, refuses with ErrCorrupt, allocates little, and what it decodes
// encodes to a state that decodes the same (for the current version, to the
// same bytes): format 1's state, and version 1, are rewritten in the
// current one.
func FuzzDecodeState(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	f.Fuzz(func(t *testing.T, b []byte) {
		var s state
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { err = decodeState(b, &s) })
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		enc := appendState(nil, &s)
		if !isLegacyMap(b[0]) && b[2] == stateVersion && !bytes.Equal(enc, b) { // older versions are rewritten in this one
			t.Fatalf("%x decodes to %+v, which encodes to %x", b, s, enc)
		}
		var again state
		if err := decodeState(enc, &again); err != nil || again != s {
			t.Fatalf("%x decodes to %+v, whose encoding decodes to %+v, %v", b, s, again, err)
		}
	})
}

// FuzzUnseal: a small value (dedup, groups, txs) unseals to n bytes, to
// nothing when absent, or is ErrCorrupt; sealing the body again gives a
// value that unseals the same (the same bytes, for a sealed one), and a
// flipped bit in a sealed value, or in its key, is ErrCorrupt.
func FuzzUnseal(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	sizes := [...]int{8, dedupBytes, decisionBytes, groupBytes} // groups before format 3, dedup, txs, groups
	f.Fuzz(func(t *testing.T, key string, val []byte, which int) {
		n := sizes[uint(which)%uint(len(sizes))]
		body, err := unseal(key, val, n)
		switch {
		case err != nil:
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		case val == nil:
			if body != nil {
				t.Fatalf("absent value unseals to %x", body)
			}
			return
		case len(body) != n:
			t.Fatalf("%x unseals to %d bytes, want %d", val, len(body), n)
		}
		sealed := appendSealed(nil, key, body)
		if len(val) == n+sealLen && !bytes.Equal(sealed, val) {
			t.Fatalf("%x unseals to %x, which seals to %x", val, body, sealed)
		}
		if again, err := unseal(key, sealed, n); err != nil || !bytes.Equal(again, body) {
			t.Fatalf("resealed %x unseals to %x, %v; want %x", sealed, again, err, body)
		}
		bit := uint(which) % uint(8*len(sealed))
		sealed[bit/8] ^= 1 << (bit % 8)
		if _, err := unseal(key, sealed, n); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("bit %d of %x flipped: %v, want ErrCorrupt", bit, sealed, err)
		}
		sealed[bit/8] ^= 1 << (bit % 8)
		if key != "" { // a key of the same length: a CRC finds every flipped bit
			other := []byte(key)
			bit := uint(which) % uint(8*len(other))
			other[bit/8] ^= 1 << (bit % 8)
			if _, err := unseal(string(other), sealed, n); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("value of %q read under %q: %v, want ErrCorrupt", key, other, err)
			}
		}
	})
}

// FuzzDecodeGroup: a group value decodes, is absent (nil only) or is
// ErrCorrupt, never a panic; what decodes encodes to a record that decodes
// the same (to the same bytes, for the current layout).
func FuzzDecodeGroup(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	f.Fuzz(func(t *testing.T, key string, val []byte) {
		var (
			g   GroupState
			ok  bool
			err error
		)
		fuzzseed.CheckAlloc(t, len(val), func() { g, ok, err = decodeGroup(key, val) })
		switch {
		case err != nil:
			if !errors.Is(err, ErrCorrupt) || ok {
				t.Fatalf("error %v (ok %v) is not ErrCorrupt", err, ok)
			}
			return
		case !ok:
			if val != nil {
				t.Fatalf("%x decodes as absent", val)
			}
			return
		}
		enc := appendGroup(nil, key, &g)
		if len(val) == groupBytes+sealLen && !bytes.Equal(enc, val) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", val, g, enc)
		}
		if again, ok, err := decodeGroup(key, enc); err != nil || !ok || again != g {
			t.Fatalf("re-encoded %+v decodes to %+v, %v, %v", g, again, ok, err)
		}
	})
}

// appendStateV1 is the state encoder before group generations (version
// 1), kept to write what older releases wrote.
func appendStateV1(dst []byte, s *state) []byte {
	start := len(dst)
	dst = append(dst, 'Z', 'S', 1)
	for _, v := range [...]uint64{s.Next, s.Low, uint64(s.Bytes), s.DedupLow, s.Applied,
		uint64(s.LastStored), s.DelaySeq, uint64(s.Delayed)} {
		dst = binary.BigEndian.AppendUint64(dst, v)
	}
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// effectRecordV1 is an effect record of version 1, as older releases
// logged them, of file id and state st (its Applied the index) putting val
// under key in the groups bucket.
func effectRecordV1(id [8]byte, st state, key string, val []byte) []byte {
	b := append([]byte{'Z', 'E', 1}, id[:]...)
	b = binary.BigEndian.AppendUint64(b, st.Applied)
	b = append(b, byte(bGroups<<1))
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(val)))
	b = append(b, val...)
	return appendStateV1(b, &st)
}

// mutation is one write of an effect record, as the test reads them.
type mutation struct {
	b   int
	del bool
	key []byte
	val []byte
}

// readMutations reads the mutations of an effect record the way gen.go's
// layout describes them, independently of writeEffects.
func readMutations(muts []byte) ([]mutation, error) {
	var out []mutation
	for len(muts) > 0 {
		op := muts[0]
		if op>>1 >= nBuckets {
			return nil, fmt.Errorf("op %#x", op)
		}
		m := mutation{b: int(op >> 1), del: op&1 == 1}
		kl, n := binary.Uvarint(muts[1:])
		if n <= 0 || kl == 0 || kl > uint64(len(muts)-1-n) {
			return nil, errors.New("bad key")
		}
		m.key, muts = muts[1+n:1+n+int(kl)], muts[1+n+int(kl):]
		if !m.del {
			if len(muts) < 4 || uint64(binary.BigEndian.Uint32(muts)) > uint64(len(muts)-4) {
				return nil, errors.New("bad value")
			}
			vl := int(binary.BigEndian.Uint32(muts))
			m.val, muts = muts[4:4+vl], muts[4+vl:]
		}
		out = append(out, m)
	}
	return out, nil
}

// FuzzEffects: an effect record (a gen, the WAL's payload) is split or
// refused with ErrCorrupt, never a panic; writeEffects, into a bbolt write
// transaction rolled back afterwards, refuses exactly the records whose
// mutations do not parse, and leaves every key it wrote at its last write;
// the mutations encoded again by gen's own encoder read back the same.
func FuzzEffects(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	// One bbolt file per process (the fuzzer runs several), opened on the
	// first input; its buckets are created once, and every input's writes
	// are rolled back.
	dir := f.TempDir()
	var db *bolt.DB
	f.Cleanup(func() {
		if db != nil {
			db.Close()
		}
	})
	f.Fuzz(func(t *testing.T, rec []byte) {
		if db == nil {
			var err error
			if db, err = bolt.Open(filepath.Join(dir, "effects.db"), 0o600, &bolt.Options{NoSync: true}); err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error {
				for _, name := range bucketNames {
					if _, err := tx.CreateBucketIfNotExists(name); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		var (
			id   [8]byte
			idx  uint64
			raw  []byte
			st   state
			err  error
			muts []mutation
			merr error
		)
		fuzzseed.CheckAlloc(t, len(rec), func() {
			id, idx, raw, st, err = splitEffects(rec)
			if err == nil {
				muts, merr = readMutations(raw)
			}
		})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("split: %v, want ErrCorrupt", err)
			}
			return
		}

		tx, err := db.Begin(true)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		var bks [nBuckets]*bolt.Bucket
		for i := range bks {
			bks[i] = tx.Bucket(bucketNames[i])
		}
		var (
			widx uint64
			wst  state
		)
		fuzzseed.CheckAlloc(t, len(rec), func() { widx, wst, err = writeEffects(&bks, rec) })
		switch {
		case merr != nil:
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("mutations that do not parse (%v) written: %v, want ErrCorrupt", merr, err)
			}
			return
		case errors.Is(err, berrors.ErrKeyTooLarge):
			return // damage bbolt refuses itself
		case err != nil:
			t.Fatalf("mutations that parse refused: %v", err)
		case widx != idx || wst != st:
			t.Fatalf("writeEffects returned %d %+v, split %d %+v", widx, wst, idx, st)
		}
		type bucketKey struct {
			b   int
			key string
		}
		last := map[bucketKey]mutation{}
		for _, m := range muts {
			last[bucketKey{m.b, string(m.key)}] = m
		}
		for _, m := range last {
			got := bks[m.b].Get(m.key)
			if m.del && got != nil || !m.del && (got == nil || !bytes.Equal(got, m.val)) {
				t.Fatalf("bucket %s key %x: %x after writing %+v", bucketNames[m.b], m.key, got, m)
			}
		}

		g := newGen(id, st, len(rec))
		for _, m := range muts {
			g.op(m.b, m.del, m.key)
			if !m.del {
				g.value(func(dst []byte) []byte { return append(dst, m.val...) })
			}
		}
		g.finish(idx)
		id2, idx2, raw2, st2, err := splitEffects(g.buf)
		if err != nil || id2 != id || idx2 != idx || st2 != st {
			t.Fatalf("re-encoded record splits to %x %d %+v, %v; want %x %d %+v", id2, idx2, st2, err, id, idx, st)
		}
		if muts2, err := readMutations(raw2); err != nil || !reflect.DeepEqual(muts2, muts) {
			t.Fatalf("re-encoded mutations read as %+v, %v; want %+v", muts2, err, muts)
		}
	})
}

// sealCRC is the check a record under key with payload p starts with.
func sealCRC(key, p []byte) uint32 {
	return crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, p)
}
