package store_test

// Hostile review of store/: each TestBreak_* fails on the code it was
// written against, and names the promise it breaks. Helpers shared with
// attack_test.go live here.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

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

// gateFS is the OS file system whose segment syncs can be held: while held,
// every Sync of a .wal file waits until released.
type gateFS struct {
	store.OSFS
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

func (g *gateFS) OpenFile(name string, flag int, perm os.FileMode) (store.File, error) {
	f, err := g.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &gateFile{File: f, fs: g}, nil
}

func (g *gateFS) hold() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *gateFS) release() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

type gateFile struct {
	store.File
	fs *gateFS
}

func (f *gateFile) Sync() error {
	f.fs.mu.Lock()
	gate := f.fs.gate
	f.fs.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return f.File.Sync()
}

// gatedNode is a partition behind a WAL whose syncs a test can hold.
func gatedNode(t *testing.T, opts store.Options) (*gateFS, *store.WAL, *store.Partition) {
	t.Helper()
	dir := t.TempDir()
	g := &gateFS{}
	w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{FS: g})
	if err != nil {
		t.Fatal(err)
	}
	opts.WAL, opts.Stream = w, "s"
	p, err := store.Open(filepath.Join(dir, "0.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.FinishRecovery(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.release()
		p.Close()
		w.Close()
	})
	return g, w, p
}

// applyTimed runs Apply with a ctx ending after d and reports how long it
// took to return (capped: after limit the gate is released so the test
// can end).
func applyTimed(t *testing.T, g *gateFS, p *store.Partition, cmd *store.Command, d, limit time.Duration) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	type out struct {
		took time.Duration
		err  error
	}
	ch := make(chan out, 1)
	start := time.Now()
	go func() {
		_, err := p.Apply(ctx, cmd)
		ch <- out{time.Since(start), err}
	}()
	select {
	case o := <-ch:
		return o.took, o.err
	case <-time.After(limit):
		g.release()
		o := <-ch
		return o.took, o.err
	}
}

// TestBreak_CtxWaitsForDisk_FullPending breaks promise 4 (Apply returns
// promptly when ctx ends, never waits for a disk): when the logged gens
// fill MaxPendingBytes, the writer takes the next command and then waits in
// room() for the WAL's sync and a bbolt commit before it signals "applied";
// a caller whose ctx ended waits for that signal, i.e. for the disk.
func TestBreak_CtxWaitsForDisk_FullPending(t *testing.T) {
	g, _, p := gatedNode(t, store.Options{MaxPendingBytes: 1})
	g.hold()
	first := make(chan error, 1)
	go func() {
		_, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}})
		first <- err
	}()
	time.Sleep(100 * time.Millisecond) // a is logged, its sync held
	took, err := applyTimed(t, g, p, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b")}},
		50*time.Millisecond, 3*time.Second)
	g.release()
	if e := <-first; e != nil {
		t.Fatalf("first send: %v", e)
	}
	if took > time.Second {
		t.Fatalf("Apply with a 50ms ctx returned after %v (%v): it waited for the held WAL sync", took, err)
	}
}

// TestBreak_CtxWaitsForDisk_Trim: the same for a command that scans (OpTrim,
// OpRelease): the writer takes it and drains the materializer (WAL sync,
// then a bbolt commit) before signalling applied.
func TestBreak_CtxWaitsForDisk_Trim(t *testing.T) {
	for _, op := range []store.Op{store.OpTrim, store.OpRelease} {
		t.Run(fmt.Sprint(op), func(t *testing.T) {
			g, _, p := gatedNode(t, store.Options{})
			g.hold()
			first := make(chan error, 1)
			go func() {
				_, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}})
				first <- err
			}()
			time.Sleep(100 * time.Millisecond)
			took, err := applyTimed(t, g, p, &store.Command{Op: op, Now: t0, MaxAge: 1}, 50*time.Millisecond, 3*time.Second)
			g.release()
			if e := <-first; e != nil {
				t.Fatalf("first send: %v", e)
			}
			if took > time.Second {
				t.Fatalf("op %d with a 50ms ctx returned after %v (%v): it waited for the held WAL sync", op, took, err)
			}
		})
	}
}

// TestBreak_TrimRaceSpuriousCorrupt breaks promise 5 in reverse (ErrCorrupt
// only for damaged bytes): a reader takes its snapshot (state with the old
// Low) and then begins its bbolt read transaction; when a trim's gen is
// committed into the file in between, Read finds the head deleted and
// reports "offset N missing from the log" as ErrCorrupt, on an intact file.
func TestBreak_TrimRaceSpuriousCorrupt(t *testing.T) {
	for _, mode := range []string{"NoWAL", "WAL"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			var opts store.Options
			if mode == "WAL" {
				w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				opts = store.Options{WAL: w, Stream: "s", MaterializeAfter: time.Nanosecond}
			}
			p, err := store.Open(filepath.Join(dir, "0.db"), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			stop := make(chan struct{})
			var bad atomic.Value
			var reads atomic.Int64
			var wg sync.WaitGroup
			for range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						_, err := p.Read(0, 100, 0, nil)
						if err == nil {
							_, err = p.SeekTime(t0 + 5)
						}
						reads.Add(1)
						if err != nil {
							bad.CompareAndSwap(nil, err)
						}
					}
				}()
			}
			deadline := time.Now().Add(4 * time.Second)
			i := 0
			for time.Now().Before(deadline) && bad.Load() == nil {
				i++
				m := msg(fmt.Sprint(i))
				if _, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0 + int64(i), Msgs: []store.Message{m}}); err != nil {
					t.Fatal(err)
				}
				if _, err := p.Apply(ctx, &store.Command{Op: store.OpTrim, Now: t0 + int64(i), MaxBytes: 1}); err != nil {
					t.Fatal(err)
				}
			}
			close(stop)
			wg.Wait()
			if err, _ := bad.Load().(error); err != nil {
				t.Fatalf("after %d trims and %d reads of an intact file: %v", i, reads.Load(), err)
			}
			t.Logf("%d trims, %d reads, no spurious error", i, reads.Load())
		})
	}
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

// TestBreak_WALLastWriteFlipCutSilently breaks promise 5 ("damaged bytes
// anywhere ... give ErrCorrupt ... never a silent cut of acked data"): one
// flipped byte inside the last write of the newest segment, a write that was
// synced and acknowledged, is taken for a torn tail and cut: the acked
// message is silently gone. A tear over the zero-filled segment leaves whole
// zero sectors (or a short file); a frame with no zero sector that fails its
// CRC is damage, but scan() never looks.
// (TestWAL_TornTail/flip asserts the opposite of the promise.)
func TestBreak_WALLastWriteFlipCutSilently(t *testing.T) {
	for _, where := range []string{"RecordBody", "RecordCRC", "WriteHeader"} {
		t.Run(where, func(t *testing.T) {
			crash := crashImage(t, 10, nil)
			seg := segments(t, crash)[0]
			b, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			fr := walFrames(t, b)
			last, hdr := fr[len(fr)-1], fr[len(fr)-2]
			if last.write || !hdr.write {
				t.Fatalf("unexpected layout: %+v", fr[len(fr)-2:])
			}
			switch where {
			case "RecordBody":
				b[last.off+8+int64(len(last.body))-3] ^= 0x01
			case "RecordCRC":
				b[last.off+4] ^= 0x01
			case "WriteHeader":
				b[hdr.off+8+2] ^= 0x01 // inside the write number
			}
			if err := os.WriteFile(seg, b, 0o600); err != nil {
				t.Fatal(err)
			}
			r, err := openWALNode(t, crash)
			if errors.Is(err, store.ErrCorrupt) && strings.Contains(err.Error(), seg) {
				return // what the promise asks
			}
			if err != nil {
				t.Fatalf("open: %v, want ErrCorrupt naming %s", err, seg)
			}
			bodies, _ := readAll(t, r.p)
			t.Fatalf("one flipped byte in the last acked write: open succeeded with %d of 10 acked messages (want ErrCorrupt naming the segment)", len(bodies))
		})
	}
}

// forgedWriteHeader is a write header frame, as scan() recognizes one,
// claiming the segment was synced up to synced.
func forgedWriteHeader(synced uint64) []byte {
	body := make([]byte, 17)
	body[0] = 1
	binary.BigEndian.PutUint64(body[1:], 7)
	binary.BigEndian.PutUint64(body[9:], synced)
	fr := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	fr = binary.BigEndian.AppendUint32(fr, crc32.Checksum(body, castagnoliT))
	return append(fr, body...)
}

// TestBreak_TornTailWithForgedHeaderInBody breaks promise 5 ("a torn tail
// of the WAL, a write that was never acked, is cut"): syncedPast() searches
// the raw bytes after a bad frame for anything that looks like a write
// header, including the payload of a record. A message body that carries
// such bytes (any binary payload can; a WAL segment shipped through the
// queue does) turns a genuine torn write into ErrCorrupt, and the node does
// not open after an ordinary power loss.
func TestBreak_TornTailWithForgedHeaderInBody(t *testing.T) {
	const sector = 512
	body := func(i int) []byte {
		if i < 9 {
			return []byte(fmt.Sprint("body-", i))
		}
		b := bytes.Repeat([]byte{'x'}, 3*sector)
		return append(b, forgedWriteHeader(1<<40)...)
	}
	crash := crashImage(t, 10, body)
	seg := segments(t, crash)[0]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	fr := walFrames(t, b)
	hdr := fr[len(fr)-2] // the header of the last write: the torn one
	if !hdr.write {
		t.Fatalf("unexpected layout")
	}
	forged := bytes.LastIndex(b, forgedWriteHeader(1<<40))
	// Power loss during the last write's sync: the sectors from the write's
	// start to the one holding the forged bytes never reached the disk
	// (they read as the zeros allocated ahead); the later ones did.
	keepFrom := int64(forged) / sector * sector
	clear(b[hdr.off:keepFrom])
	// Nor did the seal, which is written only once the sync returned.
	last := fr[len(fr)-1]
	sealAt := last.off + 8 + int64(len(last.body))
	clear(b[sealAt : sealAt+8+25])
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := openWALNode(t, crash)
	if err != nil {
		t.Fatalf("open after a torn, never acknowledged last write: %v (want the tail cut)", err)
	}
	bodies, _ := readAll(t, r.p)
	equal(t, "replayed", len(bodies), 9)
}

// TestBreak_DamagedHalfPagePanics breaks promise 5/6 (never a panic): the
// writer reads the file outside its recover: ready() -> view.cost() reads
// the half bucket (OpPrepare, OpCommitTx, OpTxChecked) and start() looks up
// buckets before builder.apply installs its deferred recover. A damaged
// page of the half bucket panics in the writer goroutine and kills the
// process. Run in a child process.
func TestBreak_DamagedHalfPagePanics(t *testing.T) {
	if path := os.Getenv("ZEZE_BREAK_HALF"); path != "" {
		p, err := store.Open(path, store.Options{})
		if err != nil {
			fmt.Println("open:", err)
			os.Exit(0)
		}
		// The first command makes the gen non-empty, so ready() sizes the
		// second with cost(), which reads the half bucket.
		_, errs, err := p.ApplyBatch(context.Background(), []*store.Command{
			{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 1},
			{Op: store.OpPrepare, Now: t0, TxID: "tx-3", Msgs: []store.Message{msg("x")}},
		})
		fmt.Println("apply:", errs, err)
		p.Close()
		os.Exit(0)
	}
	path := filepath.Join(t.TempDir(), "0.db")
	p, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 64 {
		m := msg(fmt.Sprint(i))
		m.Body = bytes.Repeat([]byte{'h'}, 1000)
		apply(t, p, &store.Command{Op: store.OpPrepare, TxID: fmt.Sprint("tx-", i), Msgs: []store.Message{m}})
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Damage the page type of the half bucket's root page.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var root uint64
	db.View(func(tx *bolt.Tx) error { root = uint64(tx.Bucket([]byte("half")).Root()); return nil })
	pageSize := db.Info().PageSize
	db.Close()
	if root == 0 {
		t.Fatal("half bucket is inline")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0, 0}, int64(root)*int64(pageSize)+8) // page flags
	f.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestBreak_DamagedHalfPagePanics$")
	cmd.Env = append(os.Environ(), "ZEZE_BREAK_HALF="+path)
	out, err := cmd.CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("panic")) {
		t.Fatalf("a damaged half page crashed the process (%v):\n%s", err, firstLines(out, 40))
	}
	t.Logf("child: %s", out)
	if !bytes.Contains(out, []byte("ErrCorrupt")) && !bytes.Contains(out, []byte("corrupt")) {
		t.Fatalf("want ErrCorrupt naming the file, got:\n%s", out)
	}
}

func firstLines(b []byte, n int) string {
	lines := strings.SplitN(string(b), "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// readFailFS fails the first n ReadAt calls on .wal files with EIO.
type readFailFS struct {
	store.OSFS
	left atomic.Int64
}

func (f *readFailFS) OpenFile(name string, flag int, perm os.FileMode) (store.File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &readFailFile{File: file, fs: f}, nil
}

type readFailFile struct {
	store.File
	fs *readFailFS
}

func (f *readFailFile) ReadAt(b []byte, off int64) (int, error) {
	if f.fs.left.Add(-1) >= 0 {
		return 0, syscall.EIO
	}
	return f.File.ReadAt(b, off)
}

// TestBreak_ReplayRetryLosesRecords breaks promises 1, 2 and 7: WAL.Recover
// deletes the stream's index before reading it, so when one read fails (a
// transient EIO) and the caller retries store.Open on the same WAL, the
// retry replays nothing: the partition opens without its acked messages and
// hands their offsets to new messages; FinishRecovery then deletes the only
// copy.
func TestBreak_ReplayRetryLosesRecords(t *testing.T) {
	crash := crashImage(t, 10, nil)
	rf := &readFailFS{}
	w, err := store.OpenWAL(filepath.Join(crash, "wal"), store.WALOptions{FS: rf})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	path := filepath.Join(crash, "0.db")
	rf.left.Store(1) // the next read, Recover's first, fails once
	if _, err := store.Open(path, store.Options{WAL: w, Stream: "t/0"}); err == nil {
		t.Fatal("open with a failing read succeeded")
	}
	p, err := store.Open(path, store.Options{WAL: w, Stream: "t/0"})
	if err != nil {
		return // refusing is fine: nothing lost
	}
	defer p.Close()
	bodies, _ := readAll(t, p)
	if len(bodies) != 10 {
		acks := appendAt(t, p, t0, msg("new"))
		t.Fatalf("retried Open after one failed read: %d of 10 acked messages, and a new send got offset %d (reused)", len(bodies), acks[0].Offset)
	}
}

// TestBreak_StreamReuseReplaysStaleRecords breaks promises 1 and 2: a
// stream's records of an earlier incarnation of its file (closed, removed
// with RemoveFile, created again, as a deleted and re-created topic would)
// stay in the current segment; after a crash replay applies them (index 1..)
// and skips the new incarnation's records as already applied: the acked
// messages are replaced by the deleted ones at the same offsets.
func TestBreak_StreamReuseReplaysStaleRecords(t *testing.T) {
	dir := t.TempDir()
	w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "0.db")
	p, err := store.Open(path, store.Options{WAL: w, Stream: "t/0"})
	if err != nil {
		t.Fatal(err)
	}
	w.FinishRecovery()
	for i := range 5 {
		appendAt(t, p, t0, msg(fmt.Sprint("old", i)))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := store.RemoveFile(path); err != nil {
		t.Fatal(err)
	}
	p, err = store.Open(path, store.Options{WAL: w, Stream: "t/0", MaterializeAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		appendAt(t, p, t0, msg(fmt.Sprint("new", i)))
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	p.Close()
	w.Close()

	r, err := openWALNode(t, crash)
	if err != nil {
		if errors.Is(err, store.ErrCorrupt) {
			return // detected: acceptable
		}
		t.Fatal(err)
	}
	bodies, _ := readAll(t, r.p)
	want := []string{"body-new0", "body-new1", "body-new2"}
	if fmt.Sprint(bodies) != fmt.Sprint(want) {
		t.Fatalf("after a crash the re-created partition holds %q, want its acked %q", bodies, want)
	}
}
