package store

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/zeze-go/mq/internal/fuzzseed"
)

// The layouts below are formats: a change to one of these tests is a
// format change, and needs a new version.

func TestState_Layout(t *testing.T) {
	s := state{Next: 9, Low: 2, Bytes: 3, DedupLow: 4, Applied: 5, LastStored: 6, DelaySeq: 7, Delayed: 8, GroupGen: 10}
	b := appendState(nil, &s)
	const want = "5a5302" +
		"0000000000000009" + "0000000000000002" + "0000000000000003" + "0000000000000004" +
		"0000000000000005" + "0000000000000006" + "0000000000000007" + "0000000000000008" +
		"000000000000000a"
	if got := hex.EncodeToString(b[:len(b)-4]); got != want {
		t.Fatalf("state layout\n got %s\nwant %s", got, want)
	}
	var back state
	if err := decodeState(b, &back); err != nil || back != s {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	for _, bad := range [][]byte{
		nil,
		b[:len(b)-1],
		append(bytes.Clone(b), 0),
		func() []byte { c := bytes.Clone(b); c[2] = 3; return c }(), // unknown version
		func() []byte { c := bytes.Clone(b); c[2] = 1; return c }(), // version 1 is shorter
		func() []byte { c := bytes.Clone(b); c[10] ^= 1; return c }(),
	} {
		if err := decodeState(bad, &back); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodeState(%x) = %v, want ErrCorrupt", bad, err)
		}
	}
}

// TestState_LayoutV1: the state before group generations (files and
// effect records of format 2) reads with GroupGen 0.
func TestState_LayoutV1(t *testing.T) {
	v1, _ := hex.DecodeString("5a5301" +
		"0000000000000009" + "0000000000000002" + "0000000000000003" + "0000000000000004" +
		"0000000000000005" + "0000000000000006" + "0000000000000007" + "0000000000000008")
	v1 = binary.BigEndian.AppendUint32(v1, crc32.Checksum(v1, castagnoli))
	want := state{Next: 9, Low: 2, Bytes: 3, DedupLow: 4, Applied: 5, LastStored: 6, DelaySeq: 7, Delayed: 8}
	if !bytes.Equal(appendStateV1(nil, &want), v1) {
		t.Fatal("appendStateV1 is not the version 1 layout")
	}
	var s state
	if err := decodeState(v1, &s); err != nil || s != want {
		t.Fatalf("version 1 state = %+v, %v; want %+v", s, err, want)
	}
	if err := decodeState(append(bytes.Clone(v1), make([]byte, 8)...), &s); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("version 1 state of version 2's length: %v, want ErrCorrupt", err)
	}
}

// TestEffects_VersionOne: an effect record of version 1 (written before
// group generations, ending with a version 1 state) splits and writes as
// before; a version 2 record must end with a version 2 state.
func TestEffects_VersionOne(t *testing.T) {
	st := state{Next: 1, Bytes: 5, Applied: 8, LastStored: 6}
	fid := [8]byte{'f', 'i', 'l', 'e', 'i', 'd', 0, 1}
	v1 := effectRecordV1(fid, st, "g", appendSealed(nil, "g", be.AppendUint64(nil, 7)))
	id, idx, muts, got, err := splitEffects(v1)
	if err != nil || id != fid || idx != 8 || got != st {
		t.Fatalf("split: %q %d %+v, %v", id, idx, got, err)
	}
	m, err := readMutations(muts)
	if err != nil || len(m) != 1 || m[0].b != bGroups || string(m[0].key) != "g" {
		t.Fatalf("mutations: %+v, %v", m, err)
	}
	if g, ok, err := decodeGroup("g", m[0].val); err != nil || !ok || g != (GroupState{Offset: 7}) {
		t.Fatalf("group value of a version 1 record: %+v %v %v", g, ok, err)
	}
	v2 := bytes.Clone(v1)
	v2[2] = effVersion
	if _, _, _, _, err := splitEffects(v2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("version 2 record with a version 1 state: %v, want ErrCorrupt", err)
	}
}

// TestGroup_Layout: the group record of format 3, and those before it.
func TestGroup_Layout(t *testing.T) {
	g := GroupState{Offset: 1, Generation: 2, Updated: 3, Reset: true, Lease: 4}
	b := appendGroup(nil, "g", &g)
	const want = "5a4703" + "0000000000000001" + "0000000000000002" + "0000000000000003" + "01" + "0000000000000004"
	if got := hex.EncodeToString(b[:len(b)-sealLen]); got != want {
		t.Fatalf("group layout\n got %s\nwant %s", got, want)
	}
	for _, tt := range []struct {
		name string
		val  []byte
		want GroupState
		ok   bool
	}{
		{"Current", b, g, true},
		{"Version2", appendSealed(nil, "g", append([]byte{'Z', 'G', 2}, b[3:groupBytesV2]...)), GroupState{Offset: 1, Generation: 2, Updated: 3, Reset: true}, true},
		{"Version1", appendSealed(nil, "g", append([]byte{'Z', 'G', 1}, b[3:groupBytesV1]...)), GroupState{Offset: 1, Generation: 2, Updated: 3}, true},
		{"Absent", nil, GroupState{}, false},
		{"Format1", be.AppendUint64(nil, 7), GroupState{Offset: 7}, true},
		{"Format2", appendSealed(nil, "g", be.AppendUint64(nil, 7)), GroupState{Offset: 7}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := decodeGroup("g", tt.val)
			if err != nil || ok != tt.ok || got != tt.want {
				t.Fatalf("decodeGroup(%x) = %+v, %v, %v; want %+v, %v", tt.val, got, ok, err, tt.want, tt.ok)
			}
		})
	}
	for _, bad := range [][]byte{
		b[:len(b)-sealLen], // unsealed: format 3 always seals
		b[:len(b)-1],
		func() []byte { c := bytes.Clone(b); c[5] ^= 1; return c }(),
		appendSealed(nil, "g", append([]byte{'Z', 'G', 2}, make([]byte, 24)...)), // unknown version
		appendSealed(nil, "g", append([]byte{'Z', 'H', 1}, make([]byte, 24)...)),
		{},
	} {
		if _, ok, err := decodeGroup("g", bad); !errors.Is(err, ErrCorrupt) || ok {
			t.Errorf("decodeGroup(%x) = %v, %v; want ErrCorrupt", bad, ok, err)
		}
	}
	if _, _, err := decodeGroup("h", b); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a record read under another key: %v, want ErrCorrupt", err)
	}
}

// TestCommand_Layout: version 3's bytes; version 2's, which decode with
// Consumed false; and version 1's, which decode with Generation and Start
// zero too.
func TestCommand_Layout(t *testing.T) {
	c := &Command{Op: OpClaim, Now: 1, Offset: 2, Generation: 0x81, Start: StartLast, Group: "g"}
	const want = "5a43030a" + "0000000000000001" + "0000000000000002" + "0000000000" + // limit..decide TTL
		"8101" + "02" + "00" + "0167" + "00" + "00" + "00"
	if got := hex.EncodeToString(AppendCommand(nil, c)); got != want {
		t.Fatalf("command layout\n got %s\nwant %s", got, want)
	}
	trim := &Command{Op: OpTrim, Now: 1, Consumed: true}
	const wantTrim = "5a430303" + "0000000000000001" + "0000000000000000" + "0000000000" + "00" + "00" + "01" + "00" + "00" + "00" + "00"
	if got := hex.EncodeToString(AppendCommand(nil, trim)); got != wantTrim {
		t.Fatalf("trim layout\n got %s\nwant %s", got, wantTrim)
	}
	for _, flags := range []string{"02", "81", "ff"} {
		b, _ := hex.DecodeString(wantTrim[:len(wantTrim)-10] + flags + "00000000")
		if _, err := DecodeCommand(b); !errors.Is(err, ErrBadCommand) {
			t.Fatalf("flags %s: %v, want ErrBadCommand", flags, err)
		}
	}
	v2, _ := hex.DecodeString("5a43020a" + "0000000000000001" + "0000000000000002" + "0000000000" + "8101" + "02" + "0167" + "00" + "00" + "00")
	if got, err := DecodeCommand(v2); err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("version 2 command = %+v, %v; want %+v", got, err, c)
	}
	v1, _ := hex.DecodeString("5a430102" + "0000000000000001" + "0000000000000007" + "0000000000" + "0167" + "00" + "00" + "00")
	got, err := DecodeCommand(v1)
	want1 := &Command{Op: OpCommitOffset, Now: 1, Offset: 7, Group: "g"}
	if err != nil || !reflect.DeepEqual(got, want1) {
		t.Fatalf("version 1 command = %+v, %v; want %+v", got, err, want1)
	}
	for _, v := range []string{"ZC\x00", "ZC\x04"} {
		if _, err := DecodeCommand(append([]byte(v), v1[3:]...)); !errors.Is(err, ErrBadCommand) {
			t.Fatalf("version %d: %v, want ErrBadCommand", v[2], err)
		}
	}
}

func TestCommand_RoundTrip(t *testing.T) {
	cmds := []*Command{
		{Op: OpAppend, Now: 1, Msgs: []Message{{ID: "a", Key: "k", Tags: []string{"t1", "t2"},
			Properties: map[string]string{"p": "v"}, Body: []byte("body"), Timestamp: -5, DeliverAt: 9, ReconsumeTimes: 3, FreshID: true}}},
		{Op: OpCommitOffset, Now: 2, Group: "g", Offset: 1 << 60},
		{Op: OpTrim, Now: 3, Limit: 10, MaxAge: 11, MaxBytes: 12, DedupTTL: 13, DecideTTL: 14},
		{Op: OpTrim, Now: 3, Consumed: true},
		{Op: OpPrepare, Now: 4, TxID: "tx", Producer: "node", Msgs: []Message{{Body: []byte{}}, {}}},
		{Op: OpCommitTx, Now: 5, TxID: "tx"},
		{Op: OpCommitOffset, Now: 6, Group: "g", Offset: 3, Generation: 1<<64 - 1},
		{Op: OpClaim, Now: 7, Group: "g", Start: StartFirst},
		{Op: OpResetOffset, Now: 8, Group: "g", Offset: 9},
		{Op: OpClaim, Now: 9, Start: 255}, // decodes; check refuses it
	}
	for _, c := range cmds {
		b := AppendCommand(nil, c)
		got, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", c, err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Fatalf("round trip\n got %+v\nwant %+v", got, c)
		}
		for i := range len(b) {
			if _, err := DecodeCommand(b[:i]); !errors.Is(err, ErrBadCommand) {
				t.Fatalf("decode of %d of %d bytes: %v, want ErrBadCommand", i, len(b), err)
			}
		}
	}
}

// FuzzDecodeCommand: no input panics or allocates beyond its length; every
// error wraps ErrBadCommand; what decodes encodes back to the same command.
func FuzzDecodeCommand(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	f.Fuzz(func(t *testing.T, b []byte) {
		var (
			c   *Command
			err error
		)
		fuzzseed.CheckAlloc(t, len(b), func() { c, err = DecodeCommand(b) })
		if err != nil {
			if !errors.Is(err, ErrBadCommand) {
				t.Fatalf("error %v does not wrap ErrBadCommand", err)
			}
			return
		}
		again, err := DecodeCommand(AppendCommand(nil, c))
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("re-encoded command decodes to %+v, %v; want %+v", again, err, c)
		}
	})
}

// FuzzDecodeRecord: a record's payload decoder never panics and never
// allocates beyond its input; the stored form (CRC over key and payload,
// then the payload) decodes the same or is ErrCorrupt, and with a flipped
// CRC is ErrCorrupt; what decodes encodes to a record that decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	key := []byte{0, 0, 0, 0, 0, 0, 0, 7}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Message
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { err = decodeMessagePayload(b, &m, false) })
		stored := append(binary.BigEndian.AppendUint32(nil, sealCRC(key, b)), b...)
		var sm Message
		serr := decodeRecord(key, stored, &sm)
		switch {
		case serr != nil && !errors.Is(serr, ErrCorrupt):
			t.Fatalf("record error %v is not ErrCorrupt", serr)
		case (serr == nil) != (err == nil):
			t.Fatalf("payload decodes with %v, the record with %v", err, serr)
		case err == nil && !reflect.DeepEqual(sm, m):
			t.Fatalf("record decodes to %+v, its payload to %+v", sm, m)
		}
		stored[0] ^= 0x80
		if err := decodeRecord(key, stored, &sm); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("record with a flipped CRC: %v, want ErrCorrupt", err)
		}
		if err != nil {
			return
		}
		var again Message
		if err := decodeRecord(key, appendRecord(nil, key, &m), &again); err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("re-encoded record decodes to %+v, %v; want %+v", again, err, m)
		}
	})
}

// FuzzDecodeHalf: the half transaction decoder (both formats) never panics,
// refuses with ErrCorrupt and allocates little; what decodes encodes (in the
// current format, which format 1's halves are rewritten in) to a half that
// decodes the same.
func FuzzDecodeHalf(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	f.Fuzz(func(t *testing.T, b []byte) {
		var (
			h   *halfTx
			err error
		)
		fuzzseed.CheckAlloc(t, len(b), func() { h, err = decodeHalf(b) })
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		// Not the same bytes: a uvarint may have been written longer.
		enc := appendHalf(nil, h)
		again, err := decodeHalf(enc)
		if err != nil || !sameHalf(again, h) {
			t.Fatalf("re-encoded half decodes to %+v, %v; want %+v", again, err, h)
		}
	})
}

// sameHalf compares halves, a nil record equal to an empty one.
func sameHalf(a, b *halfTx) bool {
	if a.Producer != b.Producer || a.FirstSeen != b.FirstSeen || a.LastCheck != b.LastCheck ||
		a.Checks != b.Checks || len(a.Records) != len(b.Records) {
		return false
	}
	for i := range a.Records {
		if !bytes.Equal(a.Records[i], b.Records[i]) {
			return false
		}
	}
	return true
}

// FuzzWALSegment: OpenWAL over any segment content either opens or returns
// ErrCorrupt, never panics, and what it recovers is what the intact records
// held: each stream's payloads, in order, of the frames before the first bad
// one.
func FuzzWALSegment(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	f.Fuzz(func(t *testing.T, b []byte, older int) {
		dir := t.TempDir()
		name := "0000000000000001.wal"
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if older%2 == 1 { // a newer segment makes this one older
			os.WriteFile(filepath.Join(dir, "0000000000000002.wal"), nil, 0o600)
		}
		w, err := OpenWAL(dir, WALOptions{})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("OpenWAL: %v, want ErrCorrupt", err)
			}
			return
		}
		defer w.Close()
		want := intactRecords(b)
		for stream := range w.streams() {
			var got [][]byte
			err := w.Recover(stream, 0, func(rec []byte) error { got = append(got, rec); return nil })
			if err != nil && !errors.Is(err, ErrFormat) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Recover(%q): %v", stream, err)
			}
			if err == nil && !reflect.DeepEqual(got, want[stream]) {
				t.Fatalf("Recover(%q) = %q, want %q", stream, got, want[stream])
			}
			delete(want, stream)
		}
		if len(want) > 0 {
			t.Fatalf("streams %q not recovered", want)
		}
	})
}

// intactRecords returns the payloads of each stream's records in the
// format 2 or 3 segment b, up to its first bad frame.
func intactRecords(b []byte) map[string][][]byte {
	out := map[string][][]byte{}
	if len(b) < int(walHeaderLen) || string(b[:len(walMagic)]) != walMagic && string(b[:len(walMagic)]) != walMagicV2 {
		return out
	}
	salt := b[len(walMagic):walHeaderLen]
	for rest := b[walHeaderLen:]; len(rest) >= walFrameLen; {
		l := binary.BigEndian.Uint32(rest)
		if l == 0 || l > walMaxFrame || uint64(l) > uint64(len(rest)-walFrameLen) {
			break
		}
		body := rest[walFrameLen : walFrameLen+l]
		if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(rest[4:]) ||
			body[0] == frameWrite && (len(body) != writeBodyLen || !bytes.Equal(body[1:9], salt)) {
			break
		}
		if body[0] == frameRecord && len(body) >= 3 {
			if nl := int(binary.BigEndian.Uint16(body[1:])); len(body) >= 3+nl {
				out[string(body[3:3+nl])] = append(out[string(body[3:3+nl])], body[3+nl:])
			}
		}
		rest = rest[walFrameLen+l:]
	}
	return out
}

// streams returns the names of the streams with records to recover.
func (w *WAL) streams() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]bool{}
	for s := range w.rec {
		out[s] = true
	}
	return out
}

// TestWAL_FormatOneSegment: a format 1 segment's records (frames from byte
// 8, after its 8-byte header) are found; one not yet applied is ErrFormat.
func TestWAL_FormatOneSegment(t *testing.T) {
	dir := t.TempDir()
	body := []byte{0, 3, 't', '/', '0', 0, 0, 0, 0, 0, 0, 0, 5, 'c', 'm', 'd'}
	seg := []byte(walMagicV1)
	seg = binary.BigEndian.AppendUint32(seg, uint32(len(body)))
	seg = binary.BigEndian.AppendUint32(seg, crc32.Checksum(body, castagnoli))
	seg = append(seg, body...)
	if err := os.WriteFile(filepath.Join(dir, "0000000000000001.wal"), seg, 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := OpenWAL(dir, WALOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Recover("t/0", 5, func([]byte) error { return nil }); err != nil {
		t.Fatalf("applied record of format 1: %v", err)
	}
	if err := w.Recover("t/0", 4, func([]byte) error { return nil }); !errors.Is(err, ErrFormat) {
		t.Fatalf("unapplied record of format 1: %v, want ErrFormat", err)
	}
}
