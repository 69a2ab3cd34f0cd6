package store_test

import (
	"context"
	"testing"
	"unsafe"

	"github.com/zeze-go/mq/store"
)

func openReplicated(t testing.TB, path string) *store.Partition {
	t.Helper()
	p, err := store.Open(path, store.Options{Replicated: true})
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close(%s): %v", path, err)
		}
	})
	return p
}

func applyLogged(t testing.TB, p *store.Partition, index uint64, cmds ...*store.Command) []store.Result {
	t.Helper()
	at := make([]store.Position, len(cmds))
	for i := range cmds {
		at[i] = store.Position{Index: index, Cmds: uint64(i + 1)}
	}
	res, errs, err := p.ApplyLogged(context.Background(), cmds, at)
	if err != nil {
		t.Fatalf("ApplyLogged(%d): %v", index, err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ApplyLogged(%d): command %d: %v", index, i, err)
		}
	}
	return res
}

func appendCmd(names ...string) *store.Command {
	c := &store.Command{Op: store.OpAppend, Now: t0}
	for _, n := range names {
		c.Msgs = append(c.Msgs, msg(n))
	}
	return c
}

// inside reports whether b is a non-empty slice of buf's array.
func inside(b, buf []byte) bool {
	if len(b) == 0 {
		return false
	}
	p, lo, hi := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&buf[len(buf)-1]))
	return p >= lo && p <= hi
}
