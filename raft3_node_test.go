package mq_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/zeze-go/mq"
)

// Raft3 at the level of a node: one node's replica files
// damaged while it is down, a node reopened with other options, a node
// killed (SIGKILL) while it recovers, a node whose disk fails while sends
// flow. The node under test runs in a child process of the test binary
// (TestRaft3NodeChild) wherever its failure could take the test
// binary with it (a panic, a fault, a full disk); the two others run here.

const (
	r3nodeDirEnv   = "ZEZE_MQ_R3NODE_DIR"
	r3nodeIDEnv    = "ZEZE_MQ_R3NODE_ID"
	r3nodeSeedsEnv = "ZEZE_MQ_R3NODE_SEEDS"
	r3nodePartsEnv = "ZEZE_MQ_R3NODE_PARTS"
	r3nodeFsizeEnv = "ZEZE_MQ_R3NODE_FSIZE" // RLIMIT_FSIZE of the child, bytes
)

// r3nodeBody is the body of message id: a marker naming it (found again in
// the files), then padding.
func r3nodeBody(id string) []byte {
	b := []byte("BODY<" + id + ">")
	return append(b, bytes.Repeat([]byte{'#'}, 512-len(b))...)
}

// TestRaft3NodeChild is the node under test, in a child process:
// it opens its directory as node R3NODE_ID joining R3NODE_SEEDS, says OPENED
// (or OPENERR and the error), then answers the lines of its standard
// input: "read" reads every message of r3 through this node (M p off id
// crc, or E p off err, then DONE), "topics" says T and the partitions of
// r3 it shows. At the end of its input it closes, says CLOSED (or
// CLOSEHANG), and LEAK with the goroutines left behind if any.
func TestRaft3NodeChild(t *testing.T) {
	dir := os.Getenv(r3nodeDirEnv)
	if dir == "" {
		t.Skip("child process of the TestRaft3Node tests")
	}
	r3nodeChild(dir) // never returns
}

func r3nodeChild(dir string) {
	say := func(format string, args ...any) { fmt.Fprintf(os.Stdout, format+"\n", args...) }
	if s := os.Getenv(r3nodeFsizeEnv); s != "" {
		n, _ := strconv.ParseUint(s, 10, 64)
		signal.Ignore(syscall.SIGXFSZ)
		var lim syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
			say("OPENERR getrlimit: %v", err)
			os.Exit(0)
		}
		lim.Cur = n
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
			say("OPENERR setrlimit: %v", err)
			os.Exit(0)
		}
	}
	parts, _ := strconv.Atoi(os.Getenv(r3nodePartsEnv))
	base := goleak.IgnoreCurrent()
	say("OPENING")
	serverTLS, clientTLS, err := childTLS()
	if err != nil {
		say("OPENERR %v", err)
		os.Exit(0)
	}
	m, err := mq.Open(dir, mq.WithCluster(mq.ClusterConfig{
		NodeID: os.Getenv(r3nodeIDEnv), Bind: "127.0.0.1:0", Seeds: strings.Split(os.Getenv(r3nodeSeedsEnv), ","),
		Secret: clusterSecret, ServerTLS: serverTLS, ClientTLS: clientTLS, SessionTimeout: time.Second, ElectionTimeout: 200 * time.Millisecond,
	}), mq.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		say("OPENERR %v", err)
		os.Exit(0)
	}
	say("OPENED")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "read":
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			for p := range parts {
				for off := int64(0); ; off++ {
					msg, err := m.ReadMessage(ctx, r3, p, off)
					if errors.Is(err, mq.ErrNoMessage) {
						break
					}
					if err != nil {
						say("E %d %d %s", p, off, strings.ReplaceAll(err.Error(), "\n", " "))
						break
					}
					say("M %d %d %s %08x", p, off, msg.ID, crc32.ChecksumIEEE(msg.Body))
				}
			}
			cancel()
			say("DONE")
		case "topics":
			say("T %d", m.Topics()[r3])
		}
	}
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		say("CLOSED %v", err)
	case <-time.After(20 * time.Second):
		say("CLOSEHANG")
		os.Exit(0)
	}
	if err := goleak.Find(base); err != nil {
		say("LEAK %s", strings.ReplaceAll(err.Error(), "\n", " | "))
	}
	say("EXIT")
	os.Exit(0)
}

// truncateTo cuts the file at path to frac of its size.
func truncateTo(t testing.TB, path string, frac float64) {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, int64(float64(info.Size())*frac)); err != nil {
		t.Fatal(err)
	}
}

// breakFreelist marks the freelist page of the bbolt file at path (as its
// newest valid meta page names it) a branch page: bbolt panics reading it
// ("invalid freelist page").
func breakFreelist(t testing.TB, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Page header: id u64, flags u16, count u16, overflow u32 (16 bytes).
	// Meta (after the header): magic u32, version u32, pageSize u32, flags
	// u32, root bucket (root pgid u64, sequence u64), freelist pgid u64,
	// pgid u64, txid u64, checksum u64.
	var best, bestTx uint64
	var pageSize uint64
	for _, off := range []int{0, 4096} {
		if off+16+64 > len(b) {
			continue
		}
		m := b[off+16:]
		if binary.LittleEndian.Uint32(m[0:]) != 0xED0CDAED {
			continue
		}
		ps := uint64(binary.LittleEndian.Uint32(m[8:]))
		free := binary.LittleEndian.Uint64(m[32:])
		tx := binary.LittleEndian.Uint64(m[48:])
		if tx >= bestTx {
			best, bestTx, pageSize = free, tx, ps
		}
	}
	if pageSize == 0 || best == 0 || (best+1)*pageSize > uint64(len(b)) {
		t.Fatalf("%s: no freelist page found (page size %d, freelist %d)", path, pageSize, best)
	}
	flags := best*pageSize + 8
	if got := binary.LittleEndian.Uint16(b[flags:]); got != 0x10 {
		t.Fatalf("%s: page %d has flags %#x, not a freelist page", path, best, got)
	}
	binary.LittleEndian.PutUint16(b[flags:], 0x01) // a branch page
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRaft3Node_DamagedPartitionDB: one replica's partition.db
// damaged while its node is down: a replica that meets damage does not
// serve, sends the call on and hands its leadership over
// (replica.Raft3.checkDamage); with FlipRecord it once answered ErrCorrupt
// for acked messages the two others hold intact. TruncateHalf logs a clear
// ErrCorrupt and leaves the replica out; Empty is rebuilt from the raft log.
// The default run has FlipRecord; the others run with ZEZE_FULL=1.
func TestRaft3Node_DamagedPartitionDB(t *testing.T) {
	parallelByDefault(t)
	const parts = 4
	t.Run("FlipRecord", func(t *testing.T) {
		// A byte of every message's body, in each partition.db of n3:
		// bbolt's structure stays intact, the records' CRCs do not match.
		damagedReplica(t, parts, func(c *testCluster) {
			n := 0
			for i := range parts {
				var ids []string
				for j := range 60 {
					if j%parts == i {
						ids = append(ids, fmt.Sprintf("a-%d", j))
					}
				}
				n += flipMarkers(t, partitionFile(c, "n3", i), ids...)
			}
			if n == 0 {
				t.Fatal("no record of n3's partition files found to damage")
			}
			t.Logf("%d record copies damaged", n)
		})
	})
	t.Run("TruncateHalf", func(t *testing.T) {
		fullOnly(t)
		damagedReplica(t, parts, func(c *testCluster) {
			truncateTo(t, partitionFile(c, "n3", 1), 0.5)
		})
	})
	t.Run("Empty", func(t *testing.T) {
		fullOnly(t)
		// A 0-byte file: bbolt makes a new one; the raft log replays.
		damagedReplica(t, parts, func(c *testCluster) {
			truncateTo(t, partitionFile(c, "n3", 1), 0)
		})
	})
}

// TestRaft3Node_DamagedRaftDB: one replica's raft.db (terms and
// votes) damaged while its node is down: raftqueue.Open checks raft.db
// first and returns ErrCorrupt (opened by raft-boltdb's bare bbolt.Open,
// the damage once panicked or faulted inside mq.Open and killed the
// process). The default run has Freelist; the others run with ZEZE_FULL=1.
func TestRaft3Node_DamagedRaftDB(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	t.Run("Freelist", func(t *testing.T) {
		damagedReplica(t, parts, func(c *testCluster) {
			breakFreelist(t, filepath.Join(replicaDir(c, "n3", 0), "raft.db"))
		})
	})
	t.Run("TruncateToMeta", func(t *testing.T) {
		fullOnly(t)
		// Its two meta pages kept: the pages they name are past the end.
		damagedReplica(t, parts, func(c *testCluster) {
			if err := os.Truncate(filepath.Join(replicaDir(c, "n3", 0), "raft.db"), 8192); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("Flip", func(t *testing.T) {
		fullOnly(t)
		damagedReplica(t, parts, func(c *testCluster) {
			path := filepath.Join(replicaDir(c, "n3", 0), "raft.db")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			for range 64 {
				b[8192+r.IntN(len(b)-8192)] ^= 0xff
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// TestRaft3Node_DamagedSnapshot: a snapshot of one replica damaged.
// No real snapshot is reachable in a short test (raft snapshots after
// SnapshotThreshold 2048 entries and SnapshotInterval 120 s), so these are
// forged: a newest snapshot naming an index past the replica's file whose
// state.bin does not match its CRC, and one whose meta.json is garbage.
// Held (a clear "CRC mismatch" logged and the replica left out; a bad
// meta.json skipped). MetaGarbage runs with ZEZE_FULL=1 only.
func TestRaft3Node_DamagedSnapshot(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	forge := func(c *testCluster, meta string, state []byte) {
		dir := filepath.Join(replicaDir(c, "n3", 0), "snapshots", "99-100000-1700000000000")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "meta.json"), []byte(meta), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "state.bin"), state, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("StateCRC", func(t *testing.T) {
		damagedReplica(t, parts, func(c *testCluster) {
			forge(c, `{"Version":1,"ID":"99-100000-1700000000000","Index":100000,"Term":99,"Peers":null,`+
				`"Configuration":{"Servers":[{"Suffrage":0,"ID":"n1","Address":"n1"},{"Suffrage":0,"ID":"n2","Address":"n2"},{"Suffrage":0,"ID":"n3","Address":"n3"}]},`+
				`"ConfigurationIndex":1,"Size":16,"CRC":"AAAAAAAAAAA="}`, bytes.Repeat([]byte{0xAB}, 16))
		})
	})
	t.Run("MetaGarbage", func(t *testing.T) {
		fullOnly(t)
		damagedReplica(t, parts, func(c *testCluster) {
			forge(c, "{not json", []byte("x"))
		})
	})
}

// TestRaft3Node_DamagedReplicaBlocksOthers: n3's replica of
// partition 0 damaged (a clear error, as it should be), its replica of
// partition 1 intact: a Raft3 replica that fails to open is served by the
// others and tried again at each metadata change, and the node opens the
// partitions after it (it once stopped at the damaged one, so that with n1
// closed partition 1 had no quorum although n2 and n3 hold it intact).
//
// Partitions that share a raft group (PartitionsPerRaftGroup, 8 by
// default) share this fault: one damaged file keeps the node's replica of
// their group out, so with n1 closed too none of them has a quorum. Here
// each partition has a group of its own.
func TestRaft3Node_DamagedReplicaBlocksOthers(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	c, l := damagedSetupWith(t, parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 1})
	truncateTo(t, partitionFile(c, "n3", 0), 0.5)
	n3 := c.start("n3") // boltsafe reports the damage: no panic here
	time.Sleep(2 * time.Second)
	if _, holds := mq.Raft3Leader(n3, r3, 1); !holds {
		t.Errorf("n3 did not open its intact replica of %s/1 because its replica of %s/0 is damaged", r3, r3)
	}
	c.kill("n1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := c.nodes["n2"].NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	msg := (&mq.Message{ID: "p1", Body: r3nodeBody("p1")}).ToPartition(1)
	if err := l.sendOne(ctx, p, "p1", msg); err != nil {
		t.Errorf("send to %s/1 with n1 closed (n2 and n3 hold intact replicas of it): %v", r3, err)
	}
}

// startWith opens node id of c like c.start, its cluster config changed by
// cc and with opts (instead of c.opts).
func startWith(c *testCluster, id string, cc func(*mq.ClusterConfig), opts ...mq.Option) *mq.MQ {
	c.t.Helper()
	var seeds []string
	for other, m := range c.nodes {
		if other != id {
			seeds = append(seeds, m.ClusterStatus().Addr)
		}
	}
	conf := mq.ClusterConfig{NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: clusterSecret,
		SessionTimeout: time.Second, ElectionTimeout: 200 * time.Millisecond}
	conf.ServerTLS, conf.ClientTLS = nodeTLS(c.t, id)
	if cc != nil {
		cc(&conf)
	}
	m, err := mq.Open(filepath.Join(c.root, id), append([]mq.Option{mq.WithCluster(conf)}, opts...)...)
	if err != nil {
		c.t.Fatalf("open %s: %v", id, err)
	}
	c.nodes[id] = m
	c.t.Cleanup(func() { m.Close() })
	return m
}

// TestRaft3Node_ReopenOtherOptions: n3 reopened with options other
// than it was created with (another election timeout and session, a sync
// interval, a retention and dedup window, a message limit below the
// stored messages' size): its replicas come back and, with n1 closed, the
// quorum needs them: every ack is read back, and sends go on.
func TestRaft3Node_ReopenOtherOptions(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	c, l := damagedSetup(t, parts) // nothing damaged: n3 closed with every message
	sendN(t, l, c.nodes["n2"], "b", 20, parts)
	n3 := startWith(c, "n3", func(cc *mq.ClusterConfig) {
		cc.ElectionTimeout, cc.SessionTimeout = time.Second, 3*time.Second
	}, mq.WithSyncInterval(20*time.Millisecond), mq.WithRetention(time.Hour), mq.WithDedupWindow(time.Second),
		mq.WithMaxMessageBytes(256), mq.WithMaintenanceInterval(50*time.Millisecond))
	waitFor(t, 20*time.Second, "n3's replicas", func() bool {
		for i := range parts {
			if _, holds := mq.Raft3Leader(n3, r3, i); !holds {
				return false
			}
		}
		return true
	})
	waitReadable(t, n3, parts)
	sendN(t, l, c.nodes["n1"], "c", 20, parts)
	c.kill("n1")
	leaders := leadersSeenBy(t, c.nodes["n2"], parts, "n1")
	t.Logf("leaders with n1 closed: %v", leaders)
	verify(t, "through n3 with n1 closed", n3, parts, l)
	verify(t, "through n2 with n1 closed", c.nodes["n2"], parts, l)
	sendN(t, l, c.nodes["n2"], "d", 20, parts)
	time.Sleep(200 * time.Millisecond) // several maintenance rounds on n3
	verify(t, "through n2 after more sends", c.nodes["n2"], parts, l)
}

// TestRaft3Node_KillDuringRecovery: n3, down while n1 and n2 take
// sends, is reopened in a child process and killed (SIGKILL) while it
// recovers: at once, a little later, and just after Open returned; then
// opened cleanly here. Its replicas rejoin: with n1 closed the quorum
// needs them, and every ack is read back at its offset. Held.
func TestRaft3Node_KillDuringRecovery(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	c := newCluster(t, 3, withRaft3(parts))
	for i := range parts {
		leaderOf(t, c, i)
	}
	l := newLedger()
	sendN(t, l, c.nodes["n1"], "a", 200, parts)
	time.Sleep(500 * time.Millisecond)
	c.kill("n3")
	// Sends flow through n1 and n2 the whole time n3 is damaged.
	stop := make(chan struct{})
	flowDone := make(chan struct{})
	go func() {
		defer close(flowDone)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		p, err := c.nodes["n2"].NewProducer(r3)
		if err != nil {
			t.Error(err)
			return
		}
		defer p.Close()
		for j := 0; ; j++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("f-%d", j)
			msg := (&mq.Message{ID: id, Key: fmt.Sprintf("f/%d", j%parts), Body: r3nodeBody(id)}).ToPartition(j % parts)
			if err := l.sendOne(ctx, p, "f", msg); err != nil {
				t.Errorf("send %s while n3 recovers: %v", id, err)
				return
			}
		}
	}()
	r := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	for cycle, after := range []string{"OPENING", "OPENING", "OPENING", "OPENED", "OPENED"} {
		ch := startNodeChild(t, c, "n3", parts)
		ch.expect(30*time.Second, after)
		var d time.Duration
		if cycle > 0 && after == "OPENING" {
			d = time.Duration(r.IntN(400)) * time.Millisecond
		}
		time.Sleep(d)
		t.Logf("cycle %d: SIGKILL %v after %s", cycle, d, after)
		ch.kill()
	}
	close(stop)
	<-flowDone
	n3 := c.start("n3")
	waitFor(t, 20*time.Second, "n3's replicas", func() bool {
		for i := range parts {
			if _, holds := mq.Raft3Leader(n3, r3, i); !holds {
				return false
			}
		}
		return true
	})
	waitReadable(t, n3, parts)
	time.Sleep(time.Second) // n3 catches up
	t.Logf("%d acked", len(l.ids()))
	needN3(t, c, parts, func(what string, m *mq.MQ) {
		sendN(t, l, m, fmt.Sprintf("z%d", len(l.ids())), 10, parts)
		verify(t, "through "+what, m, parts, l)
		verify(t, "through n3, "+what[3:], n3, parts, l)
	})
}

// TestRaft3Node_DiskFails: n3, in a child process whose files may
// not grow past 20 MiB (RLIMIT_FSIZE: writes past it fail with EFBIG),
// holds a replica of every partition while n1 and n2 send large messages:
// its WAL, which holds its replicas' raft logs, fails. Sends go on through
// the two others; n3's Close returns and leaves nothing behind; reopened
// here on a healthy disk with n1 closed, it holds every ack. Held.
func TestRaft3Node_DiskFails(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	c := newCluster(t, 2)
	ch := startNodeChild(t, c, "n3", parts, r3nodeFsizeEnv+"="+strconv.Itoa(20<<20))
	ch.expect(30*time.Second, "OPENED")
	c.waitUp(3)
	createR3(t, c, parts)
	for i := range parts {
		if _, holds := mq.Raft3Leader(c.nodes["n1"], r3, i); !holds {
			t.Fatalf("n1 holds no replica of %s/%d", r3, i)
		}
		leadersSeenBy(t, c.nodes["n1"], parts)
	}
	l := newLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	big := func(id string) []byte { return bytes.Repeat(r3nodeBody(id), 64) } // 32 KiB
	errc := make(chan error, 2)
	for _, via := range []string{"n1", "n2"} {
		go func() {
			p, err := c.nodes[via].NewProducer(r3)
			if err != nil {
				errc <- err
				return
			}
			defer p.Close()
			for j := range 350 {
				id := fmt.Sprintf("%s-%d", via, j)
				msg := (&mq.Message{ID: id, Key: fmt.Sprintf("%s/%d", via, j%parts), Body: big(id)}).ToPartition(j % parts)
				if err := l.sendOne(ctx, p, via, msg); err != nil {
					errc <- fmt.Errorf("send %s through %s with n3's disk failing: %w", id, via, err)
					return
				}
			}
			errc <- nil
		}()
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d acked; n3 logged:\n%.1500s", len(l.ids()), ch.stderr.String())
	if !strings.Contains(ch.stderr.String(), "file too large") {
		t.Logf("n3's disk did not fail: the limit was not reached")
	}
	ch.close()
	n3 := c.start("n3")
	waitFor(t, 20*time.Second, "n3's replicas", func() bool {
		for i := range parts {
			if _, holds := mq.Raft3Leader(n3, r3, i); !holds {
				return false
			}
		}
		return true
	})
	time.Sleep(2 * time.Second) // n3 catches up
	check := func(what string, m *mq.MQ) {
		t.Helper()
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer rcancel()
		l.mu.Lock()
		defer l.mu.Unlock()
		bad := 0
		for id, res := range l.acked {
			msg, err := m.ReadMessage(rctx, r3, res.Partition, res.Offset)
			if err != nil || msg.ID != id || !bytes.Equal(msg.Body, big(id)) {
				if bad < 8 {
					t.Errorf("%s: %s acked at %d/%d: read %v, %v", what, id, res.Partition, res.Offset, msg, err)
				}
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d acked messages not read back", what, bad, len(l.acked))
		}
	}
	needN3(t, c, parts, func(what string, m *mq.MQ) {
		check("through "+what, m)
		check("through n3, "+what[3:], n3)
	})
}
