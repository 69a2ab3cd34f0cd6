package store_test

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// walNode is a partition file and a WAL in one directory, opened like the
// node does.
type walNode struct {
	dir string
	wal *store.WAL
	p   *store.Partition
}

func (n *walNode) close(t testing.TB) {
	if n.p == nil {
		return
	}
	if err := n.p.Close(); err != nil {
		t.Errorf("close partition: %v", err)
	}
	if err := n.wal.Close(); err != nil {
		t.Errorf("close wal: %v", err)
	}
	n.p = nil
}

func openWALNode(t testing.TB, dir string) (*walNode, error) {
	return openWALNodeWith(t, dir, store.Options{})
}

// stalled is a partition that keeps what it logs out of its file for an
// hour: a copy of its directory taken while it runs is what a crash leaves
// with every acknowledged command only in the WAL.
var stalled = store.Options{MaterializeAfter: time.Hour}

func openWALNodeWith(t testing.TB, dir string, opts store.Options) (*walNode, error) {
	t.Helper()
	w, p, err := openWALPartition(filepath.Join(dir, "wal"), store.WALOptions{}, filepath.Join(dir, "0.db"), opts)
	if err != nil {
		return nil, err
	}
	n := &walNode{dir: dir, wal: w, p: p}
	t.Cleanup(func() { n.close(t) })
	return n, nil
}

// openWALPartition opens a WAL and one partition (stream "t/0") behind it,
// and finishes the WAL's recovery.
func openWALPartition(walDir string, wopts store.WALOptions, path string, opts store.Options) (*store.WAL, *store.Partition, error) {
	w, err := store.OpenWAL(walDir, wopts)
	if err != nil {
		return nil, nil, err
	}
	opts.WAL, opts.Stream = w, "t/0"
	p, err := store.Open(path, opts)
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	if err := w.FinishRecovery(); err != nil {
		p.Close()
		w.Close()
		return nil, nil, err
	}
	return w, p, nil
}

func mustWALNode(t testing.TB, dir string) *walNode {
	t.Helper()
	return mustWALNodeWith(t, dir, store.Options{})
}

func mustWALNodeWith(t testing.TB, dir string, opts store.Options) *walNode {
	t.Helper()
	n, err := openWALNodeWith(t, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// copyDir copies src into dst file by file: with the materializer stalled,
// a copy taken while the node runs is what a crash leaves on disk.
func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		defer out.Close()
		_, err = io.Copy(out, in)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func segments(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(m)
	return m
}

// crashedWithTen returns a directory as a crash leaves it after ten acked
// appends that were only logged, and stalls materialization for the test.
func crashedWithTen(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	for i := range 10 {
		appendAt(t, n.p, t0, msg(fmt.Sprint(i)))
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	return crash
}

// sealLen is the length of a WAL write header frame, which also seals the
// last synced write.
const sealLen = 8 + 25

// newestSegment returns the path and the bytes of the newest WAL segment
// of the node in dir.
func newestSegment(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	segs := segments(t, dir)
	seg := segs[len(segs)-1]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	return seg, b
}

var castagnoliT = crc32.MakeTable(crc32.Castagnoli)

// walFrame is one frame of a segment as the format describes it.
type walFrame struct {
	off   int64 // of the frame header
	typ   byte
	body  []byte
	write bool
}

// walFrames parses the frames of a segment's bytes (after its 8-byte
// header) up to the first zero length.
func walFrames(t testing.TB, b []byte) []walFrame {
	t.Helper()
	var out []walFrame
	off := int64(16) // magic and salt
	for off+8 <= int64(len(b)) {
		l := int64(binary.BigEndian.Uint32(b[off:]))
		if l == 0 || off+8+l > int64(len(b)) {
			break
		}
		body := b[off+8 : off+8+l]
		if crc32.Checksum(body, castagnoliT) != binary.BigEndian.Uint32(b[off+4:]) {
			break
		}
		out = append(out, walFrame{off: off, typ: body[0], body: body, write: body[0] == 1})
		off += 8 + l
	}
	if n := len(out); n > 0 && out[n-1].write {
		out = out[:n-1] // the seal after the last synced write
	}
	return out
}

// crashImage returns a directory as a process crash leaves a node whose
// partition logged n appends (one write each) and materialized none.
func crashImage(t *testing.T, n int, body func(i int) []byte) string {
	t.Helper()
	dir := t.TempDir()
	node := mustWALNodeWith(t, dir, stalled)
	for i := range n {
		m := msg(fmt.Sprint(i))
		if body != nil {
			m.Body = body(i)
		}
		appendAt(t, node.p, t0, m)
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	return crash
}

// appendWait appends payload to stream of w and waits for its answer.
func appendWait(t testing.TB, w *store.WAL, stream string, payload []byte) {
	t.Helper()
	done := make(chan error, 1)
	w.Append(stream, payload, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatalf("append: %v", err)
	}
}

// recoverAll returns the records of stream that w recovered.
func recoverAll(t testing.TB, w *store.WAL, stream string) [][]byte {
	t.Helper()
	var out [][]byte
	if err := w.Recover(stream, 0, func(rec []byte) error {
		out = append(out, append([]byte(nil), rec...))
		return nil
	}); err != nil {
		t.Fatalf("recover: %v", err)
	}
	return out
}
