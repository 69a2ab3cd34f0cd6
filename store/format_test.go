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
)

// The layouts below are formats: a change to one of these tests is a
// format change, and needs a new version.

func TestState_Layout(t *testing.T) {
	s := state{Next: 9, Low: 2, Bytes: 3, DedupLow: 4, Applied: 5, LastStored: 6, DelaySeq: 7, Delayed: 8}
	b := appendState(nil, &s)
	const want = "5a5301" +
		"0000000000000009" + "0000000000000002" + "0000000000000003" + "0000000000000004" +
		"0000000000000005" + "0000000000000006" + "0000000000000007" + "0000000000000008"
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
		func() []byte { c := bytes.Clone(b); c[2] = 2; return c }(), // unknown version
		func() []byte { c := bytes.Clone(b); c[10] ^= 1; return c }(),
	} {
		if err := decodeState(bad, &back); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodeState(%x) = %v, want ErrCorrupt", bad, err)
		}
	}
}

func TestCommand_RoundTrip(t *testing.T) {
	cmds := []*Command{
		{Op: OpAppend, Now: 1, Msgs: []Message{{ID: "a", Key: "k", Tags: []string{"t1", "t2"},
			Properties: map[string]string{"p": "v"}, Body: []byte("body"), Timestamp: -5, DeliverAt: 9, ReconsumeTimes: 3, FreshID: true}}},
		{Op: OpCommitOffset, Now: 2, Group: "g", Offset: 1 << 60},
		{Op: OpTrim, Now: 3, Limit: 10, MaxAge: 11, MaxBytes: 12, DedupTTL: 13, DecideTTL: 14},
		{Op: OpPrepare, Now: 4, TxID: "tx", Producer: "node", Msgs: []Message{{Body: []byte{}}, {}}},
		{Op: OpCommitTx, Now: 5, TxID: "tx"},
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

// FuzzDecodeCommand: no input panics or allocates beyond its length; what
// decodes encodes back to the same bytes.
func FuzzDecodeCommand(f *testing.F) {
	f.Add(AppendCommand(nil, &Command{Op: OpAppend, Now: 1, Msgs: []Message{{ID: "a", Body: []byte("b"), Tags: []string{"t"}}}}))
	f.Add(AppendCommand(nil, &Command{Op: OpCommitOffset, Now: 1, Group: "g", Offset: 7}))
	f.Add([]byte("ZC\x01\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\x0f"))
	f.Add([]byte("ZC\x01\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x05\xdd\xff\xff\xff\xff\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
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
// allocates beyond its input.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(appendMessage(nil, &Message{ID: "id", Key: "k", Tags: []string{"a"}, Properties: map[string]string{"x": "y"}, Body: []byte("body")}))
	f.Add([]byte{0x9a, 0xcc, 1, 0xa1, 'a', 0xa0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x9a, 0xcc, 1, 0xdb, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Message
		if err := decodeMessagePayload(b, &m); err != nil {
			return
		}
		var again Message
		if err := decodeMessagePayload(appendMessage(nil, &m), &again); err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("re-encoded record decodes to %+v, %v; want %+v", again, err, m)
		}
	})
}

// FuzzDecodeHalf: the half transaction decoder (both formats) never panics.
func FuzzDecodeHalf(f *testing.F) {
	f.Add(appendHalf(nil, &halfTx{Producer: "n", FirstSeen: 1, Checks: 2, Records: [][]byte{[]byte("r")}}))
	f.Add([]byte{0x85, 0xa1, 'r', 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHalf(b)
		if err == nil && b[0] == 'Z' {
			again, err := decodeHalf(appendHalf(nil, h))
			if err != nil || !reflect.DeepEqual(again, h) {
				t.Fatalf("re-encoded half decodes to %+v, %v; want %+v", again, err, h)
			}
		}
	})
}

// FuzzWALSegment: OpenWAL over any segment content either opens or returns
// ErrCorrupt, never panics, and what it recovers is what the intact records
// held.
func FuzzWALSegment(f *testing.F) {
	seg := []byte(walMagic + "saltsalt")
	seg = appendFrame(seg, append([]byte{frameWrite}, "saltsalt\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x10"...), nil, "")
	seg = appendFrame(seg, nil, []byte("payload"), "s")
	f.Add(seg, 0)
	f.Add(seg, 20)
	f.Add([]byte(walMagicV1), 0)
	f.Add(make([]byte, 64), 0)
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
		for stream := range w.streams() {
			err := w.Recover(stream, 0, func(rec []byte) error { return nil })
			if err != nil && !errors.Is(err, ErrFormat) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Recover(%q): %v", stream, err)
			}
		}
	})
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
