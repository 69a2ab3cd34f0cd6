package raftqueue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

// walLogFuzzInput joins record payloads into one fuzz input: each a uvarint
// length, then the payload.
func walLogFuzzInput(payloads ...[]byte) []byte {
	var b []byte
	for _, p := range payloads {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

// splitFuzzInput splits a fuzz input into payloads; a length running past
// the end takes the rest.
func splitFuzzInput(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 {
			return append(out, b)
		}
		b = b[k:]
		n = min(n, uint64(len(b)))
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

// entriesRecord is the 'L' record StoreLogs writes for logs.
func entriesRecord(logs ...*raft.Log) []byte {
	p := binary.AppendUvarint([]byte{recEntries}, uint64(len(logs)))
	for _, e := range logs {
		p = appendLog(p, e)
	}
	return p
}

// FuzzWALLogRecord: records of a group's log, as a restart reads them
// (each retained payload through the replay OpenWALLog does). No input
// panics or allocates more than fuzzseed.AllocBudget; a record that
// decodes encodes back to the same bytes; a replay that succeeds leaves
// one run of entries, each decoding from its record at its index, the
// same as replaying the records one entry at a time by index.
func FuzzWALLogRecord(f *testing.F) {
	e := func(i, term uint64, data string) *raft.Log {
		return &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: []byte(data), AppendedAt: time.Unix(0, 1<<60)}
	}
	l1 := entriesRecord(e(1, 1, "a"), e(2, 1, ""), &raft.Log{Index: 3, Term: 1, Type: raft.LogConfiguration, Extensions: []byte("x"), AppendedAt: time.Unix(0, -5)})
	l2 := entriesRecord(e(3, 2, "b"), e(4, 2, "c"))
	f.Add(walLogFuzzInput(l1))
	f.Add(walLogFuzzInput(l1, appendTail(nil, 2), appendPrefix(nil, 2, false), l2))
	f.Add(walLogFuzzInput(l1, appendPrefix(nil, 9, true), entriesRecord(e(20, 3, "d"))))
	f.Add(walLogFuzzInput(l1, entriesRecord(e(7, 1, "gap"))))
	f.Add(walLogFuzzInput(l1[:len(l1)-1], []byte{recTail}, []byte{recPrefix, 1, 2}, []byte{'?'}, nil))
	f.Add(walLogFuzzInput(entriesRecord(e(1<<63, 1, "")), appendTail(nil, 1<<64-1)))
	// The last index there is: the replay's loop over indexes must end.
	f.Add(walLogFuzzInput(entriesRecord(e(1<<64-2, 1, ""), e(1<<64-1, 1, "")), appendTail(nil, 1<<64-1)))
	f.Add(walLogFuzzInput(entriesRecord(e(1<<64-1, 1, ""), e(0, 1, ""))))
	scratch, _, err := openMemLog(memfs.New(), 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { scratch.Close() })
	f.Fuzz(func(t *testing.T, b []byte) {
		payloads := splitFuzzInput(b)
		for _, p := range payloads {
			checkRecordRoundTrip(t, p)
		}
		var l *WALLog
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { l, err = replayPayloads(scratch, payloads) })
		want, refErr := replayByIndex(payloads)
		if err != nil {
			if refErr == nil {
				t.Fatalf("replay: %v; one entry at a time: %d entries", err, len(want))
			}
			return
		}
		got, err := replayedEntries(l, payloads)
		if err != nil {
			t.Fatal(err)
		}
		if refErr != nil || !sameEntries(got, want) {
			t.Fatalf("replay: %d entries from %d; one entry at a time: %d entries, %v", len(got), l.first, len(want), refErr)
		}
	})
}

// checkRecordRoundTrip checks that a record that decodes encodes back to
// the same bytes.
func checkRecordRoundTrip(t *testing.T, p []byte) {
	t.Helper()
	if len(p) == 0 {
		return
	}
	var again []byte
	switch p[0] {
	case recEntries:
		locs, err := scanEntries(store.WALRecord{}, p)
		if err != nil {
			return
		}
		logs := make([]*raft.Log, len(locs))
		for i, loc := range locs {
			logs[i] = new(raft.Log)
			if _, err := decodeLog(p[loc.off:loc.off+loc.len], logs[i]); err != nil {
				t.Fatalf("entry %d scanned, then not decoded: %v", loc.index, err)
			}
		}
		again = entriesRecord(logs...)
	case recPrefix:
		first, all, err := decodePrefix(p)
		if err != nil {
			return
		}
		again = appendPrefix(nil, first, all)
	case recTail:
		from, err := decodeTail(p)
		if err != nil {
			return
		}
		again = appendTail(nil, from)
	default:
		return
	}
	if !bytes.Equal(again, p) {
		t.Fatalf("record %q decodes, and encodes back as %q", p, again)
	}
}

// replayByIndex replays records one entry at a time, into a map by index:
// what the replayer must find, without its shortcuts.
func replayByIndex(payloads [][]byte) ([]*raft.Log, error) {
	ents := map[uint64]*raft.Log{}
	dropIf := func(cut func(i uint64) bool) {
		maps.DeleteFunc(ents, func(i uint64, _ *raft.Log) bool { return cut(i) })
	}
	for _, p := range payloads {
		if len(p) == 0 {
			return nil, errors.New("empty record")
		}
		switch p[0] {
		case recEntries:
			locs, err := scanEntries(store.WALRecord{}, p)
			if err != nil {
				return nil, err
			}
			dropIf(func(i uint64) bool { return i >= locs[0].index })
			for _, loc := range locs {
				e := new(raft.Log)
				if _, err := decodeLog(p[loc.off:loc.off+loc.len], e); err != nil {
					return nil, err
				}
				ents[e.Index] = e
			}
		case recPrefix:
			first, all, err := decodePrefix(p)
			if err != nil {
				return nil, err
			}
			dropIf(func(i uint64) bool { return all || i < first })
		case recTail:
			from, err := decodeTail(p)
			if err != nil {
				return nil, err
			}
			dropIf(func(i uint64) bool { return i >= from })
		default:
			return nil, errors.New("record type")
		}
	}
	idx := slices.Sorted(maps.Keys(ents))
	out := make([]*raft.Log, len(idx))
	for i, x := range idx {
		if i > 0 && x != idx[i-1]+1 {
			return nil, errors.New("not a run")
		}
		out[i] = ents[x]
	}
	return out, nil
}
