package raftqueue

import (
	"errors"
	"reflect"
	"testing"

	"github.com/zeze-go/mq/store"
)

func validEntry() []byte {
	cmds := []*store.Command{
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a"), msg("b")}},
		{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 7, Generation: 2},
	}
	b := entryHeader(nil, len(cmds))
	for _, c := range cmds {
		b = appendEntryCommand(b, c)
	}
	return b
}

func TestEntry_RoundTrip(t *testing.T) {
	b := validEntry()
	cmds, err := decodeEntry(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	again := entryHeader(nil, len(cmds))
	for _, c := range cmds {
		again = appendEntryCommand(again, c)
	}
	if !reflect.DeepEqual(again, b) {
		t.Fatalf("re-encoded entry differs")
	}
	for _, bad := range [][]byte{nil, b[:2], append([]byte{'Z', 'Q', 9}, b[3:]...), b[:len(b)-1], append(b[:len(b):len(b)], 0)} {
		if _, err := decodeEntry(bad, nil); !errors.Is(err, store.ErrBadCommand) {
			t.Errorf("decodeEntry(%d bytes) = %v, want ErrBadCommand", len(bad), err)
		}
	}
}

// FuzzDecodeEntry: no panic; what decodes encodes back to the same bytes'
// commands.
func FuzzDecodeEntry(f *testing.F) {
	f.Add(validEntry())
	f.Add(entryHeader(nil, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		cmds, err := decodeEntry(b, nil)
		if err != nil {
			if !errors.Is(err, store.ErrBadCommand) {
				t.Fatalf("error %v does not wrap ErrBadCommand", err)
			}
			return
		}
		again := entryHeader(nil, len(cmds))
		for _, c := range cmds {
			again = appendEntryCommand(again, c)
		}
		back, err := decodeEntry(again, nil)
		if err != nil || !reflect.DeepEqual(back, cmds) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
