package store

import (
	"context"
	"path/filepath"
	"testing"
)

// TestPartition_ArenaShrinks: a burst of large batches must not leave the
// writer holding an arena of their size once it is idle.
func TestPartition_ArenaShrinks(t *testing.T) {
	p, err := Open(filepath.Join(t.TempDir(), "p.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	body := make([]byte, 64<<10)
	msgs := make([]Message, 128) // 8 MiB in one command: twice the kept arena
	for i := range msgs {
		msgs[i] = Message{Body: body}
	}
	if err := p.Apply(context.Background(), &Command{Op: OpAppend, Msgs: msgs}); err != nil {
		t.Fatal(err)
	}
	// The writer acknowledges after its clean-up, and the acknowledgement
	// orders this read after it.
	if c := p.enc.buf.Cap(); c > maxArena {
		t.Fatalf("idle writer keeps a %d-byte arena, want at most %d", c, maxArena)
	}
}
