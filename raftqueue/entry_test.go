package raftqueue

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/zeze-go/mq/store"
)

func validEntry(version byte) []byte {
	cmds := []*store.Command{
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a"), msg("b")}},
		{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 7, Generation: 2},
	}
	b := entryHeader(nil, version, 4, len(cmds))
	for i, c := range cmds {
		part := 0
		if version == entryMany {
			part = 3 * i
		}
		b = appendEntryCommand(b, version, part, c)
	}
	return b
}

// encodeEntry is the proposer's encoding of cmds of parts, for a group of
// nparts partitions.
func encodeEntry(version byte, nparts int, cmds []*store.Command, parts []int) []byte {
	b := entryHeader(nil, version, nparts, len(cmds))
	for i, c := range cmds {
		b = appendEntryCommand(b, version, parts[i], c)
	}
	return b
}

func TestEntry_RoundTrip(t *testing.T) {
	for _, version := range []byte{entryOne, entryMany} {
		b := validEntry(version)
		cmds, parts, err := decodeEntry(b, 4, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[byte][]int{entryOne: {0, 0}, entryMany: {0, 3}}[version]; !reflect.DeepEqual(parts, want) {
			t.Fatalf("version %d: partitions %v, want %v", version, parts, want)
		}
		if again := encodeEntry(version, 4, cmds, parts); !reflect.DeepEqual(again, b) {
			t.Fatalf("version %d: re-encoded entry differs", version)
		}
		for _, bad := range [][]byte{nil, b[:2], append([]byte{'Z', 'Q', 9}, b[3:]...), b[:len(b)-1], append(b[:len(b):len(b)], 0)} {
			if _, _, err := decodeEntry(bad, 4, nil, nil); !errors.Is(err, store.ErrBadCommand) {
				t.Errorf("version %d: decodeEntry(%d bytes) = %v, want ErrBadCommand", version, len(bad), err)
			}
		}
	}
	// A partition the group does not have: every replica refuses the entry.
	b := entryHeader(nil, entryMany, 3, 1)
	b = appendEntryCommand(b, entryMany, 3, &store.Command{Op: store.OpAppend, Now: t0})
	if _, _, err := decodeEntry(b, 3, nil, nil); !errors.Is(err, store.ErrBadCommand) {
		t.Errorf("partition 3 of a group of 3: %v, want ErrBadCommand", err)
	}
	// An entry of a group of another number of partitions.
	if _, _, err := decodeEntry(validEntry(entryMany), 3, nil, nil); !errors.Is(err, errPartitions) {
		t.Errorf("an entry of a group of 4 on a replica of 3: %v, want errPartitions", err)
	}
	// A command that does not decode is nil; the others are kept.
	b = entryHeader(nil, entryMany, 4, 2)
	b = appendEntryCommand(b, entryMany, 1, &store.Command{Op: store.OpAppend, Now: t0, Limit: -1})
	b = appendEntryCommand(b, entryMany, 2, &store.Command{Op: store.OpAppend, Now: t0})
	cmds, parts, err := decodeEntry(b, 4, nil, nil)
	if err != nil || len(cmds) != 2 || cmds[0] != nil || cmds[1] == nil || parts[1] != 2 {
		t.Errorf("an entry with an undecodable command: %v %v %v", cmds, parts, err)
	}
}

// FuzzDecodeEntry: no panic; what decodes encodes back to the same bytes'
// commands.
func FuzzDecodeEntry(f *testing.F) {
	f.Add(validEntry(entryOne))
	f.Add(validEntry(entryMany))
	f.Add(entryHeader(nil, entryOne, 1, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		cmds, parts, err := decodeEntry(b, 4, nil, nil)
		if err != nil {
			if !errors.Is(err, store.ErrBadCommand) && !errors.Is(err, errPartitions) {
				t.Fatalf("error %v does not wrap ErrBadCommand", err)
			}
			return
		}
		if slices.Contains(cmds, nil) {
			return // an undecodable command has no encoding to compare
		}
		again := encodeEntry(entryMany, 4, cmds, parts)
		back, backParts, err := decodeEntry(again, 4, nil, nil)
		if err != nil || !reflect.DeepEqual(back, cmds) || !reflect.DeepEqual(backParts, parts) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
