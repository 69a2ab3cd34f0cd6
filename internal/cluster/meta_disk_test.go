package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/zeze-go/mq/internal/metastate"
)

// The metadata group's own files under faults: a full disk under raft.db
// and the snapshots, damage of the snapshots and the address book, writes
// that fail.

const metaFullDirEnv = "ZEZE_CLUSTER_META_FULL_DIR"

// metaFullLimit is the child's RLIMIT_FSIZE: raft.db (bbolt doubles it
// from 32 KiB) and each snapshot meet it after a few hundred topics.
const metaFullLimit = 256 << 10

// openMetaAlone opens a one-node metadata group in dir.
func openMetaAlone(dir string, log *slog.Logger) (*Meta, error) {
	_, tr := raft.NewInmemTransport("n1")
	return OpenMeta(MetaConfig{
		NodeID: "n1", Dir: dir, Transport: tr, Logger: log, Bootstrap: true,
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
		LeaderLeaseTimeout: 50 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
		SnapshotThreshold: 64, TrailingLogs: 16, SessionTimeout: time.Hour,
	})
}

// TestMeta_DiskFullKeepsAcked checks "a full disk is an error: no panic, no
// hang, Close returns, and nothing acknowledged is lost" on the metadata
// group's raft.db and snapshots. A child process whose files may not grow
// past metaFullLimit (RLIMIT_FSIZE, SIGXFSZ ignored: EFBIG) creates topics
// through a one-node group until proposals fail, goes on trying a while
// (elections, snapshots), and closes. Reopened without the limit, the
// group must hold every topic whose CreateTopic succeeded.
//
// Case "Log": topics of one partition, raft.db meets the limit (raft does
// not snapshot within the test). Case "Snapshot": topics of 64 partitions
// and a snapshot asked every 20 topics: the snapshots (and the state
// cache) meet it first, then raft.db, whose log is no longer compacted.
func TestMeta_DiskFullKeepsAcked(t *testing.T) {
	if env := os.Getenv(metaFullDirEnv); env != "" {
		mode, dir, _ := strings.Cut(env, ":")
		metaFullChild(dir, mode == "Snapshot")
		return
	}
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	for _, mode := range []string{"Log", "Snapshot"} {
		t.Run(mode, func(t *testing.T) { testMetaFull(t, mode) })
	}
}

func testMetaFull(t *testing.T, mode string) {
	dir := filepath.Join(t.TempDir(), "meta")
	cmd := exec.Command(os.Args[0], "-test.run=^TestMeta_DiskFullKeepsAcked$", "-test.count=1")
	cmd.Env = append(os.Environ(), metaFullDirEnv+"="+mode+":"+dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan []string, 1)
	go func() {
		var ls []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			ls = append(ls, sc.Text())
		}
		lines <- ls
	}()
	var ls []string
	select {
	case ls = <-lines:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-lines
		cmd.Wait()
		t.Fatalf("child still running after 60 s (hang); stderr:\n%s", tail(stderr.String()))
	}
	werr := cmd.Wait()
	var acked []string
	errs, done := 0, false
	for _, l := range ls {
		f := strings.SplitN(l, " ", 3)
		switch f[0] {
		case "ack":
			acked = append(acked, f[1])
		case "err":
			errs++
			if errs <= 3 {
				t.Logf("child: %s", l)
			}
		case "close", "open", "snapshot":
			t.Logf("child: %s", l)
		case "done":
			done = true
		}
	}
	if werr != nil || !done {
		t.Fatalf("child: %v, done %v, %d acked, %d errors; stderr:\n%s", werr, done, len(acked), errs, tail(stderr.String()))
	}
	if errs == 0 {
		t.Fatalf("the child created %d topics without meeting the limit", len(acked))
	}
	t.Logf("child: %d topics acked, %d errors", len(acked), errs)
	m, err := openMetaAlone(dir, discardLogger())
	if err != nil {
		t.Fatalf("reopen without the limit: %v", err)
	}
	defer m.Close()
	eventually(t, "the reopened group leads", m.IsLeader)
	var missing []string
	eventually(t, "every acked topic", func() bool {
		missing = missing[:0]
		st := m.State()
		for _, name := range acked {
			if _, ok := st.Topic(name); !ok {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0
	})
}

func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}

func metaFullChild(dir string, snapshots bool) {
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "meta full child: "+format+"\n", args...)
		os.Exit(3)
	}
	signal.Ignore(syscall.SIGXFSZ)
	lim := syscall.Rlimit{Cur: metaFullLimit, Max: metaFullLimit}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fail("setrlimit: %v", err)
	}
	m, err := openMetaAlone(dir, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		fmt.Printf("open %q\n", err.Error())
		fmt.Println("done")
		return
	}
	// The leader registers itself (up) in a proposal of its own, which on a
	// loaded machine may come after the first CreateTopic: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if nd, ok := m.State().Node("n1"); m.IsLeader() && ok && nd.Up {
			break
		}
		if time.Now().After(deadline) {
			fail("no leader registered within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	errs, snapErrs := 0, 0
	firstErr := time.Time{}
	for i := 0; errs < 40 && (firstErr.IsZero() || time.Since(firstErr) < 3*time.Second) && time.Now().Before(deadline.Add(20*time.Second)); i++ {
		name := fmt.Sprintf("topic-%05d-%s", i, strings.Repeat("x", 100))
		parts := 1
		if snapshots {
			parts = 64
			if i%20 == 19 {
				if err := m.raft.Snapshot().Error(); err != nil {
					snapErrs++
					if snapErrs == 1 {
						fmt.Printf("snapshot %d %q\n", i, err.Error())
					}
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := m.Propose(ctx, metastate.CreateTopic{Name: name, Partitions: parts, Type: metastate.TypeSingle, Replicas: 1, Now: int64(i + 1)})
		cancel()
		if err != nil {
			errs++
			if firstErr.IsZero() {
				firstErr = time.Now()
			}
			fmt.Printf("err %d %q\n", i, err.Error())
			if errors.Is(err, metastate.ErrNotEnoughNodes) {
				fail("the leader is not registered: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		fmt.Printf("ack %s\n", name)
	}
	start := time.Now()
	cerr := m.Close()
	fmt.Printf("close %dms %v\n", time.Since(start).Milliseconds(), cerr)
	if snapshots {
		fmt.Printf("snapshot errors %d\n", snapErrs)
	}
	fmt.Println("done")
}

// TestMeta_SnapshotDamaged checks "damage is an error (ErrCorrupt
// naming the file), never a panic, never wrong data served" on the
// metadata group's snapshots. The log before the snapshot is compacted
// away, so the snapshot is the only record of the first topics.
func TestMeta_SnapshotDamaged(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, snap string)
	}{
		{"StateByte", func(t *testing.T, snap string) { flipByte(t, filepath.Join(snap, "state.bin"), 20) }},
		{"StateCut", func(t *testing.T, snap string) { cutFile(t, filepath.Join(snap, "state.bin"), 10) }},
		{"MetaByte", func(t *testing.T, snap string) { flipByte(t, filepath.Join(snap, "meta.json"), 1) }},
		{"MetaGone", func(t *testing.T, snap string) { os.Remove(filepath.Join(snap, "meta.json")) }},
		{"SnapshotGone", func(t *testing.T, snap string) { os.RemoveAll(snap) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "meta")
			m, err := openMetaAlone(dir, discardLogger())
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "n1 registered", func() bool { nd, ok := m.State().Node("n1"); return ok && nd.Up })
			create := func(i int) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := m.Propose(ctx, metastate.CreateTopic{Name: fmt.Sprint("t", i), Partitions: 1, Type: metastate.TypeSingle, Replicas: 1, Now: int64(i + 1)}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 40 {
				create(i)
			}
			if err := m.raft.Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
			for i := 40; i < 45; i++ {
				create(i)
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			snaps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*"))
			if len(snaps) != 1 {
				t.Fatalf("snapshots: %v", snaps)
			}
			tc.damage(t, snaps[0])
			m, err = openMetaAlone(dir, discardLogger())
			if err != nil {
				want := snaps[0] // the damaged snapshot, or the log that lacks what it held
				if tc.name == "SnapshotGone" {
					want = filepath.Join(dir, "raft.db")
				}
				if !errors.Is(err, metastate.ErrCorrupt) || !strings.Contains(err.Error(), want) {
					t.Fatalf("reopen: %v, want ErrCorrupt naming %s", err, want)
				}
				return
			}
			defer m.Close()
			eventually(t, "the reopened group leads", m.IsLeader)
			time.Sleep(200 * time.Millisecond)
			for i := range 45 {
				if _, ok := m.State().Topic(fmt.Sprint("t", i)); !ok {
					t.Fatalf("reopened without an error, but topic t%d is gone (state index %d)", i, m.State().Index())
				}
			}
		})
	}
}

func flipByte(t *testing.T, path string, at int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0x21
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func cutFile(t *testing.T, path string, to int64) {
	t.Helper()
	if err := os.Truncate(path, to); err != nil {
		t.Fatal(err)
	}
}

// TestAgent_AddressBookDamaged checks "a damaged address book is
// ignored, never a panic, never wrong data": every byte of the book
// changed (three ways) and every cut. A book that loads has only valid
// ids and non-empty addresses; an address changed by damage is a hint
// that RaftMux and Peer check against the id the node proves.
func TestAgent_AddressBookDamaged(t *testing.T) {
	dir := t.TempDir()
	n := &Agent{cfg: AgentConfig{ID: "n1", Dir: dir}, log: discardLogger(), addr: "127.0.0.1:7001"}
	st, _, err := metastate.New().Apply(1, metastate.RegisterNode{ID: "n2", Addr: "127.0.0.1:7002"})
	if err != nil {
		t.Fatal(err)
	}
	st, _, err = st.Apply(2, metastate.RegisterNode{ID: "node-3.x_y", Addr: "[::1]:7003"})
	if err != nil {
		t.Fatal(err)
	}
	n.saveBook(st)
	good, err := os.ReadFile(n.bookPath())
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, b []byte) {
		t.Helper()
		if err := os.WriteFile(n.bookPath(), b, 0o644); err != nil {
			t.Fatal(err)
		}
		n.book.Store(nil)
		n.loadBook()
		book := n.book.Load()
		if book == nil {
			return
		}
		for id, addr := range *book {
			if metastate.CheckNodeID(id) != nil || addr == "" || strings.ContainsAny(addr, "\n") {
				t.Fatalf("%s: the book loaded %q → %q", what, id, addr)
			}
		}
	}
	for i := range good {
		for _, x := range []byte{0x01, 0x20, 0xff} {
			b := slices.Clone(good)
			b[i] ^= x
			check(fmt.Sprintf("byte %d ^ %#x", i, x), b)
		}
	}
	for i := range len(good) {
		check(fmt.Sprintf("cut at %d", i), good[:i])
	}
	check("empty", nil)
	check("huge line", append(slices.Clone(good), strings.Repeat("a", 1<<20)...))
}

// TestAgent_HintFilesUnwritable checks "a failed write is an error
// (logged), no panic, no hang, Close returns" for the state cache and the
// address book, and "they are only hints": with their temporary files
// blocked (a directory in the way: EISDIR on every save, also the one
// Close makes), the node goes on taking proposals, closes, and reopens on
// its raft state with every topic.
func TestAgent_HintFilesUnwritable(t *testing.T) {
	a := &agents{t: t, dirs: map[string]string{}, all: map[string]*Agent{}}
	ag := a.start("n1")
	eventually(t, "n1 up", func() bool { return a.allUp(1) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := a.dirs["n1"]
	for _, f := range []string{"state.tmp", "peers.tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, f, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := os.ReadFile(cachePath(dir))
	for i := range 5 {
		if _, err := ag.Propose(ctx, metastate.CreateTopic{Name: fmt.Sprint("t", i), Partitions: 2, Type: metastate.TypeSingle, Now: int64(i + 1)}); err != nil {
			t.Fatalf("propose with the hint files blocked: %v", err)
		}
		time.Sleep(cacheEvery)
	}
	done := make(chan error, 1)
	go func() { done <- ag.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs")
	}
	if after, _ := os.ReadFile(cachePath(dir)); !bytes.Equal(before, after) {
		t.Fatal("the state cache changed although its temporary file could not be written")
	}
	delete(a.all, "n1")
	back := a.start("n1")
	eventually(t, "every topic after reopening", func() bool { return len(back.Meta().State().Topics()) == 5 })
}

const stableFailEnv = "ZEZE_CLUSTER_STABLE_FAIL_DIR"

// failingStore fails raft.db's writes once fail is set: StoreLogs (the
// disk full or failing under the log) and SetUint64 (the term and vote).
type failingStore struct {
	*raftboltdb.BoltStore
	fail *atomic.Bool
}

var errInjected = errors.New("injected: input/output error")

func (s failingStore) StoreLogs(logs []*raft.Log) error {
	if s.fail.Load() {
		return errInjected
	}
	return s.BoltStore.StoreLogs(logs)
}

func (s failingStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s failingStore) SetUint64(k []byte, v uint64) error {
	if s.fail.Load() {
		return errInjected
	}
	return s.BoltStore.SetUint64(k, v)
}

// TestMeta_StoreWriteFailureStopsMember checks "a failed write of the
// cluster's files is an error, never a panic (the process embeds the
// node)". raft.db starts failing every write (EIO) on a one-node group:
// the leader's StoreLogs fails, it steps down and stands for election,
// and hashicorp/raft's setCurrentTerm panicked when the stable store could
// not save the new term ("failed to save current term"), in raft's own
// goroutine, where nothing can recover it: the whole process died. Now the
// member stops (termStore): it leads no more, proposals fail, Close
// returns errMetaFailed, and the directory reopens.
func TestMeta_StoreWriteFailureStopsMember(t *testing.T) {
	if dir := os.Getenv(stableFailEnv); dir != "" {
		stableFailChild(dir)
		return
	}
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	dir := filepath.Join(t.TempDir(), "meta")
	cmd := exec.Command(os.Args[0], "-test.run=^TestMeta_StoreWriteFailureStopsMember$", "-test.count=1")
	cmd.Env = append(os.Environ(), stableFailEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "closed after the failure") {
		t.Fatalf("child: %v; output:\n%s", err, tail(string(out)))
	}
	t.Logf("child:\n%s", tail(string(out)))
	m, err := openMetaAlone(dir, discardLogger()) // the disk works again
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer m.Close()
	eventually(t, "the reopened member leads", m.IsLeader)
}

func stableFailChild(dir string) {
	fail := &atomic.Bool{}
	_, tr := raft.NewInmemTransport("n1")
	m, err := OpenMeta(MetaConfig{
		NodeID: "n1", Dir: dir, Transport: tr, Logger: discardLogger(), Bootstrap: true,
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
		LeaderLeaseTimeout: 50 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
		SessionTimeout: time.Hour,
		stores: func(b *raftboltdb.BoltStore) (raft.LogStore, raft.StableStore) {
			s := failingStore{b, fail}
			return s, s
		},
	})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if nd, ok := m.State().Node("n1"); ok && nd.Up {
			break
		}
		if time.Now().After(deadline) {
			fmt.Println("not registered")
			os.Exit(3)
		}
		time.Sleep(5 * time.Millisecond)
	}
	fail.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err = m.Propose(ctx, metastate.CreateTopic{Name: "t", Partitions: 1, Type: metastate.TypeSingle, Replicas: 1, Now: 1})
	cancel()
	fmt.Println("propose after the failure:", err)
	time.Sleep(time.Second) // elections
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	_, err = m.Propose(ctx, metastate.CreateTopic{Name: "u", Partitions: 1, Type: metastate.TypeSingle, Replicas: 1, Now: 2})
	cancel()
	if err == nil || m.IsLeader() {
		fmt.Printf("the failed member goes on: leader %v, propose %v\n", m.IsLeader(), err)
		os.Exit(3)
	}
	start := time.Now()
	err = m.Close()
	if !errors.Is(err, errMetaFailed) {
		fmt.Printf("Close after the failure: %v, want errMetaFailed\n", err)
		os.Exit(3)
	}
	fmt.Printf("closed after the failure in %v: %v\n", time.Since(start), err)
}
