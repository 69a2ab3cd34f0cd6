package store_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/zeze-go/mq/store"
)

func TestPartition_ApplyLogged(t *testing.T) {
	t.Run("Position", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "0.db")
		p, err := store.Open(path, store.Options{Replicated: true})
		if err != nil {
			t.Fatal(err)
		}
		applyLogged(t, p, 5, appendCmd("a"), appendCmd("b"))
		res := applyLogged(t, p, 6, appendCmd("c"))
		equal(t, "offset of c", res[0].Acks[0].Offset, uint64(2))
		equal(t, "Next", p.Stats().Next, uint64(3))
		pos, err := p.Sync()
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "Sync", pos, store.Position{Index: 6, Cmds: 1})
		applyLogged(t, p, 7, appendCmd("d"), appendCmd("e"))
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		p = openReplicated(t, path)
		equal(t, "Position after reopening", p.Position(), store.Position{Index: 7, Cmds: 2})
		bodies, _ := readAll(t, p)
		equal(t, "log", bodies, []string{"body-a", "body-b", "body-c", "body-d", "body-e"})
	})
	t.Run("NotReplicated", func(t *testing.T) {
		p, _ := open(t)
		_, _, err := p.ApplyLogged(context.Background(), []*store.Command{appendCmd("a")}, []store.Position{{Index: 1, Cmds: 1}})
		if !errors.Is(err, store.ErrBadCommand) {
			t.Fatalf("ApplyLogged on a partition not Replicated: %v, want ErrBadCommand", err)
		}
		if p.Position() != (store.Position{}) {
			t.Fatalf("Position %+v", p.Position())
		}
	})
	t.Run("WithWAL", func(t *testing.T) {
		dir := t.TempDir()
		w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if p, err := store.Open(filepath.Join(dir, "0.db"), store.Options{Replicated: true, WAL: w, Stream: "p"}); err == nil {
			p.Close()
			t.Fatal("Open Replicated with a WAL succeeded")
		}
	})
	t.Run("Snapshot", func(t *testing.T) {
		dir := t.TempDir()
		p := openReplicated(t, filepath.Join(dir, "0.db"))
		applyLogged(t, p, 3, appendCmd("a", "b"), &store.Command{Op: store.OpClaim, Now: t0, Group: "g"})
		var buf bytes.Buffer
		pos, err := p.WriteSnapshot(&buf)
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "snapshot's position", pos, store.Position{Index: 3, Cmds: 2})
		copyPath := filepath.Join(dir, "copy.db")
		if err := store.RestoreSnapshot(copyPath, &buf); err != nil {
			t.Fatal(err)
		}
		q := openReplicated(t, copyPath)
		equal(t, "copy's Position", q.Position(), pos)
		got, _ := readAll(t, q)
		want, _ := readAll(t, p)
		equal(t, "copy's log", got, want)
		g, ok, err := q.Group("g")
		if err != nil || !ok || g.Generation == 0 {
			t.Fatalf("copy's group: %+v %v %v", g, ok, err)
		}
	})
}

// TestReplicated_DecodedBodiesAlias: DecodeCommand's message bodies point
// into its input (no copy per message on a replica's apply path), and a
// command applied from them keeps its bodies once the input is overwritten,
// as a raft entry's buffer or an RPC frame may be after the apply returns.
func TestReplicated_DecodedBodiesAlias(t *testing.T) {
	p := openReplicated(t, filepath.Join(t.TempDir(), "p.db"))
	var want [][]byte
	var enc []byte
	for i := range 3 {
		cmd := &store.Command{Op: store.OpAppend, Now: 1}
		for j := range 4 {
			body := bytes.Repeat([]byte{byte('a' + i*4 + j)}, 100+j)
			want = append(want, body)
			cmd.Msgs = append(cmd.Msgs, store.Message{ID: string(body[:1]), Body: body})
		}
		enc = store.AppendCommand(enc[:0], cmd)
		dec, err := store.DecodeCommand(enc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range dec.Msgs {
			if !inside(m.Body, enc) {
				t.Fatalf("message %s: its body is not a slice of the input", m.ID)
			}
		}
		applyLogged(t, p, uint64(i+1), dec)
		for k := range enc {
			enc[k] = 0xff // the next entry reuses the buffer
		}
	}
	for off, body := range want {
		m, ok, err := p.Get(uint64(off))
		if err != nil || !ok {
			t.Fatalf("Get(%d): %v, %v", off, ok, err)
		}
		if !bytes.Equal(m.Body, body) {
			t.Fatalf("offset %d: body %q, want %q", off, m.Body, body)
		}
	}
}
