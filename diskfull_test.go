package mq_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/localtx"
)

// The disk-full test re-executes the test binary as a child that lowers its
// own RLIMIT_FSIZE, with SIGXFSZ ignored, so that a write past the limit
// fails with EFBIG ("file too large") instead of killing it. These variables
// select the child mode and its case.
const (
	diskFullDirEnv  = "ZEZE_MQ_DISKFULL_DIR"
	diskFullCaseEnv = "ZEZE_MQ_DISKFULL_CASE"
	diskFullTopic   = "full"
	diskFullWait    = 10 * time.Second // a send or Close taking longer hangs
)

// diskFullCase is one limit and one load. The limit is per file: the WAL
// segment (zero-filled 4 MiB at a time by an extender that runs up to
// 16 MiB ahead of its end), meta.db and each partition file (bbolt doubles
// it up to 16 MiB, then grows it 16 MiB past its end) each meet it on
// their own.
type diskFullCase struct {
	name     string
	limit    uint64 // RLIMIT_FSIZE of the child, bytes
	parts    int
	keyed    int // senders of one keyed message per send
	bulk     int // senders of diskFullBulkMsgs messages per send, all to partition 0 (straight into its file)
	body     int // body bytes of a keyed message
	bulkBody int // body bytes of a bulk message
	tx       bool
	openErr  bool // Open itself meets the limit
}

// bodySize is the body size of sender's messages: senders 0..keyed-1 send
// keyed messages, the next ones bulk sends.
func (tc diskFullCase) bodySize(sender int) int {
	if sender >= tc.keyed {
		return tc.bulkBody
	}
	return tc.body
}

const diskFullBulkMsgs = 20 // more than the store's bulk threshold (16)

var diskFullCases = []diskFullCase{
	// meta.db's first pages do not fit.
	{name: "OpenMeta", limit: 8 << 10, parts: 2, keyed: 1, body: 64, openErr: true},
	// The WAL's first segment cannot be zero-filled.
	{name: "OpenWAL", limit: 1 << 20, parts: 2, keyed: 1, body: 64, openErr: true},
	// Open fits; the WAL's first extensions do not.
	{name: "WALFirstSend", limit: 6 << 20, parts: 4, keyed: 4, body: 512, tx: true},
	// The WAL meets the limit after some MiB, long before any partition
	// file.
	{name: "WALFirst", limit: 24 << 20, parts: 8, keyed: 8, body: 4 << 10, tx: true},
	// Bulk sends go straight into partition 0's file, which meets the limit
	// growing past 16 MiB while the WAL, carrying the small keyed sends to
	// the other partitions, is far from it: partition 0 fails alone.
	{name: "PartitionFirst", limit: 24 << 20, parts: 3, keyed: 2, bulk: 3, body: 128, bulkBody: 8 << 10, tx: true},
}

// TestMQ_DiskFull runs a child that sends until its files reach
// RLIMIT_FSIZE, and checks that a failed write is never acknowledged, fails
// with ErrStorageFailed naming "file too large", fails closed (later sends
// to the same partition fail promptly), never panics or hangs, and that
// Close returns. The parent then reopens the directory without the limit and
// checks that every acknowledged message is at its acked offset with its
// body, every committed host transaction's message is delivered, new sends
// are acknowledged and readable, and every bbolt file checks clean.
func TestMQ_DiskFull(t *testing.T) {
	if dir := os.Getenv(diskFullDirEnv); dir != "" {
		diskFullChild(dir, os.Getenv(diskFullCaseEnv)) // never returns
	}
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	if runtime.GOOS != "linux" {
		t.Skip("RLIMIT_FSIZE and EFBIG as on Linux")
	}
	type row struct {
		name, hit   string
		limit       uint64
		acks, after int
		txs, errs   int
		sendMs      int64
	}
	var rows []row
	for _, tc := range diskFullCases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "WALFirst" {
				fullOnly(t) // WALFirstSend has the WAL meet the limit by default
			}
			dir := t.TempDir()
			out := runDiskFullChild(t, dir, tc)
			hit := out.hitFile()
			t.Logf("files after the child: %s", diskFullSizes(dir))
			if len(out.errs) > 0 {
				t.Logf("first error: %s", out.errs[0].msg)
			}
			t.Logf("close after %dms: %q", out.closeMs, out.closeErr)
			if tc.openErr {
				if out.openErr == "" {
					t.Fatalf("Open fit under a limit of %d bytes", tc.limit)
				}
				if !strings.Contains(out.openErr, "file too large") {
					t.Errorf("Open error does not say \"file too large\": %s", out.openErr)
				}
			} else {
				if out.openErr != "" {
					t.Fatalf("child could not start: %s", out.openErr)
				}
				checkDiskFullErrors(t, out)
			}
			verifyDiskFull(t, dir, tc, out)
			rows = append(rows, row{tc.name, hit, tc.limit, len(out.acks), out.acksAfter, len(out.txAcks), len(out.errs), out.slowestErrMs})
		})
	}
	t.Logf("%-15s %-8s %6s %13s %6s %7s %-18s %s", "case", "limit", "acks", "after 1st err", "txs", "errors", "hit first", "slowest failed send")
	for _, r := range rows {
		t.Logf("%-15s %-8s %6d %13d %6d %7d %-18s %dms", r.name, fmtBytes(r.limit), r.acks, r.after, r.txs, r.errs, r.hit, r.sendMs)
	}
}

func fmtBytes(n uint64) string {
	if n >= 1<<20 {
		return strconv.FormatUint(n>>20, 10) + " MiB"
	}
	return strconv.FormatUint(n>>10, 10) + " KiB"
}

// diskFullAck is a message the child saw acknowledged:
//
//	ack <sender> <seq> <partition> <offset>
type diskFullAck struct {
	sender, seq, part int
	off               int64
}

// diskFullErr is a failed send:
//
//	err <sender> <first|again> <storage-failed 0|1> <ms> <quoted error>
type diskFullErr struct {
	sender        int
	again         bool
	storageFailed bool
	ms            int64
	msg           string
}

type diskFullOut struct {
	openErr   string
	acks      []diskFullAck
	acksAfter int   // acks printed after the first failed send (other partitions)
	txAcks    []int // seqs of host transactions whose Run returned nil
	errs      []diskFullErr
	closeErr  string // "": nil
	// closeStorageFailed: Close's error wraps ErrStorageFailed
	closeStorageFailed bool
	closeMs            int64
	slowestErrMs       int64
}

// hitFile names the file whose write failed first, as the first error says.
func (o *diskFullOut) hitFile() string {
	msg := o.openErr
	if msg == "" && len(o.errs) > 0 {
		msg = o.errs[0].msg
	}
	switch {
	case msg == "":
		return "none"
	case strings.Contains(msg, "write-ahead log"), strings.Contains(msg, "wal"):
		return "wal"
	case strings.Contains(msg, "meta.db"):
		return "meta.db"
	case strings.Contains(msg, "host.db"):
		return "host.db"
	}
	if i := strings.Index(msg, "topics/"); i >= 0 {
		f := strings.Fields(msg[i:])[0]
		return strings.TrimSuffix(f, ":")
	}
	return "?"
}

func diskFullBody(sender, seq, size int) []byte {
	b := []byte(fmt.Sprintf("%d/%d/", sender, seq))
	for len(b) < size {
		b = append(b, byte('a'+(sender+seq+len(b))%26))
	}
	return b
}

func diskFullKey(sender int) string { return "k" + strconv.Itoa(sender) }

// runDiskFullChild runs the child for tc on dir and parses what it printed.
// It fails the test if the child panics, hangs or exits with an error.
func runDiskFullChild(t *testing.T, dir string, tc diskFullCase) *diskFullOut {
	t.Helper()
	cmd, stdout, stderr := startChild(t, "TestMQ_DiskFull", diskFullDirEnv+"="+dir, diskFullCaseEnv+"="+tc.name)
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
		t.Fatalf("child still running after 60s (hang); stderr:\n%s", stderr.String())
	}
	werr := cmd.Wait()
	se := stderr.String()
	if werr != nil || strings.Contains(se, "panic:") || strings.Contains(se, "fatal error") || strings.Contains(se, "DATA RACE") {
		t.Fatalf("child: %v; stderr:\n%s", werr, se)
	}
	out := &diskFullOut{}
	done := false
	for _, l := range ls {
		f := strings.SplitN(l, " ", 6)
		bad := func() { t.Fatalf("child printed %q", l) }
		switch f[0] {
		case "openerr":
			out.openErr = l[len("openerr "):]
		case "ack":
			var a diskFullAck
			if _, err := fmt.Sscanf(l, "ack %d %d %d %d", &a.sender, &a.seq, &a.part, &a.off); err != nil {
				bad()
			}
			out.acks = append(out.acks, a)
			if len(out.errs) > 0 {
				out.acksAfter++
			}
		case "txack":
			n, err := strconv.Atoi(f[1])
			if err != nil {
				bad()
			}
			out.txAcks = append(out.txAcks, n)
		case "err", "txerr":
			if len(f) != 6 {
				bad()
			}
			var e diskFullErr
			var err [3]error
			e.sender, err[0] = strconv.Atoi(f[1])
			e.again = f[2] == "again"
			e.storageFailed = f[3] == "1"
			e.ms, err[1] = strconv.ParseInt(f[4], 10, 64)
			e.msg, err[2] = strconv.Unquote(f[5])
			if errors.Join(err[:]...) != nil {
				bad()
			}
			if f[0] == "err" {
				out.errs = append(out.errs, e)
				out.slowestErrMs = max(out.slowestErrMs, e.ms)
			}
		case "close":
			ms, err1 := strconv.ParseInt(f[1], 10, 64)
			msg, err2 := strconv.Unquote(strings.Join(f[3:], " "))
			if err1 != nil || err2 != nil {
				bad()
			}
			out.closeMs, out.closeErr, out.closeStorageFailed = ms, msg, f[2] == "1"
		case "nolimit":
			t.Fatalf("the child sent for its whole time without meeting the limit of %d bytes", tc.limit)
		case "done":
			done = true
		default:
			bad()
		}
	}
	if !done {
		t.Fatalf("child ended without \"done\"; stderr:\n%s", se)
	}
	return out
}

// checkDiskFullErrors checks the child's failed sends: each one a storage
// failure that says what failed.
func checkDiskFullErrors(t *testing.T, out *diskFullOut) {
	t.Helper()
	if len(out.errs) == 0 {
		t.Fatal("no send failed")
	}
	sawEFBIG := false
	for _, e := range out.errs {
		if !e.storageFailed {
			t.Errorf("sender %d: send failed with an error that is not ErrStorageFailed: %s", e.sender, e.msg)
		}
		sawEFBIG = sawEFBIG || strings.Contains(e.msg, "file too large")
	}
	if !sawEFBIG {
		t.Errorf("no send error says \"file too large\"; first: %s", out.errs[0].msg)
	}
	if out.closeErr != "" && !out.closeStorageFailed {
		t.Errorf("Close returned an error that is not ErrStorageFailed: %s", out.closeErr)
	}
	if out.closeMs > diskFullWait.Milliseconds() {
		t.Errorf("Close took %dms", out.closeMs)
	}
}

// verifyDiskFull reopens dir without the limit and checks what the child
// acknowledged, then that the node works.
func verifyDiskFull(t *testing.T, dir string, tc diskFullCase, out *diskFullOut) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var opts []mq.Option
	var hostDB *bolt.DB
	if tc.tx {
		var err error
		hostDB, err = bolt.Open(filepath.Join(dir, "host.db"), 0o600, &bolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatalf("reopen host.db: %v", err)
		}
		defer hostDB.Close()
		host, err := localtx.NewBolt(hostDB, localtx.BoltOptions{})
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, mq.WithLocalTx(host), mq.WithTxCheckAfter(10*time.Millisecond))
	}
	m, err := mq.Open(dir, opts...)
	if err != nil {
		t.Fatalf("reopen without the limit: %v", err)
	}
	closed := false
	defer func() {
		if !closed {
			m.Close()
		}
	}()
	if err := m.CreateMQ(ctx, diskFullTopic, tc.parts, mq.Options{Type: mq.Single}); err != nil && !errors.Is(err, mq.ErrTopicExists) {
		t.Fatalf("create after reopen: %v", err)
	}

	// Every ack at its partition and offset, with its key and body.
	seen := map[[2]int64]bool{}
	for _, a := range out.acks {
		at := [2]int64{int64(a.part), a.off}
		if seen[at] {
			t.Fatalf("two acks for %d/%d", a.part, a.off)
		}
		seen[at] = true
		msg, err := m.ReadMessage(ctx, diskFullTopic, a.part, a.off)
		if err != nil {
			t.Fatalf("acked sender %d seq %d at %d/%d: %v", a.sender, a.seq, a.part, a.off, err)
		}
		if want := diskFullBody(a.sender, a.seq, tc.bodySize(a.sender)); msg.Key != diskFullKey(a.sender) || !bytes.Equal(msg.Body, want) {
			t.Fatalf("acked sender %d seq %d at %d/%d holds key %q body %.20q...", a.sender, a.seq, a.part, a.off, msg.Key, msg.Body)
		}
	}

	// Every committed transaction's message, published by the child or
	// by recovery after the reopen.
	if len(out.txAcks) > 0 {
		want := map[string]bool{}
		for _, seq := range out.txAcks {
			want["tx-"+strconv.Itoa(seq)] = true
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			missing := len(want)
			for off := int64(0); ; off++ {
				msg, err := m.ReadMessage(ctx, diskFullTopic, tc.parts-1, off)
				if errors.Is(err, mq.ErrNoMessage) {
					break
				}
				if err != nil {
					t.Fatalf("read %d/%d: %v", tc.parts-1, off, err)
				}
				if want[msg.ID] {
					missing--
				}
			}
			if missing == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d committed transactions' messages missing after 20s", missing, len(want))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// The node works with the space back: new sends to every partition
	// are acknowledged and readable.
	p, err := m.NewProducer(diskFullTopic)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4*tc.parts; i++ {
		body := diskFullBody(1000, i, tc.body)
		msg := (&mq.Message{Key: "after", Body: body}).ToPartition(i % tc.parts)
		res, err := p.SendMessage(ctx, msg)
		if err != nil {
			t.Fatalf("send after reopen: %v", err)
		}
		got, err := m.ReadMessage(ctx, diskFullTopic, res[0].Partition, res[0].Offset)
		if err != nil || !bytes.Equal(got.Body, body) {
			t.Fatalf("read back %d/%d after reopen: %v", res[0].Partition, res[0].Offset, err)
		}
	}
	closed = true
	if err := m.Close(); err != nil {
		t.Fatalf("close after reopen: %v", err)
	}

	// Every bbolt file checks clean.
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".db") || filepath.Base(path) == "host.db" {
			return err
		}
		if err := boltsafe.Check(path, nil); err != nil {
			t.Errorf("check %s: %v", path, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// diskFullChild is the child process. It lowers its RLIMIT_FSIZE, opens a
// node (and, for cases with transactions, a host bbolt DB) and sends from
// several goroutines until each has failed a send and then failed again
// (the failure is sticky), or 2s after the first failure, printing each
// ack the moment it returns; then it closes the node.
func diskFullChild(dir, name string) {
	var tc diskFullCase
	for _, c := range diskFullCases {
		if c.name == name {
			tc = c
		}
	}
	var out sync.Mutex // one write(2) per line: stdout is a pipe, not under the limit
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "disk full child: "+format+"\n", args...)
		os.Exit(3)
	}
	if tc.name == "" {
		fail("no case %q", name)
	}
	signal.Ignore(syscall.SIGXFSZ)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fail("getrlimit: %v", err)
	}
	lim.Cur = tc.limit
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fail("setrlimit: %v", err)
	}
	exit := func() {
		say("done")
		os.Exit(0)
	}

	ctx := context.Background()
	var opts []mq.Option
	var host *localtx.Bolt
	if tc.tx {
		db, err := bolt.Open(filepath.Join(dir, "host.db"), 0o600, &bolt.Options{Timeout: time.Second})
		if err != nil {
			fail("host db: %v", err)
		}
		defer db.Close()
		if host, err = localtx.NewBolt(db, localtx.BoltOptions{}); err != nil {
			fail("host: %v", err)
		}
		opts = append(opts, mq.WithLocalTx(host))
	}
	m, err := mq.Open(dir, opts...)
	if err != nil {
		say("openerr %v", err)
		exit()
	}
	if err := m.CreateMQ(ctx, diskFullTopic, tc.parts, mq.Options{Type: mq.Single}); err != nil {
		say("openerr create: %v", err)
		closeDiskFullChild(m, say)
		exit()
	}
	p, err := m.NewProducer(diskFullTopic)
	if err != nil {
		fail("producer: %v", err)
	}

	var stop atomic.Bool
	var firstErr sync.Once
	stopAfterFirst := func() {
		firstErr.Do(func() { time.AfterFunc(2*time.Second, func() { stop.Store(true) }) })
	}
	// report prints a failed send; it fails the child on a hang.
	report := func(kind string, sender int, again bool, t0 time.Time, err error) {
		ms := time.Since(t0).Milliseconds()
		if errors.Is(err, context.DeadlineExceeded) {
			fail("sender %d: %s hung for %v: %v", sender, kind, diskFullWait, err)
		}
		word, sf := "first", "0"
		if again {
			word = "again"
		}
		if errors.Is(err, mq.ErrStorageFailed) {
			sf = "1"
		}
		say("%s %d %s %s %d %q", kind, sender, word, sf, ms, err.Error())
		stopAfterFirst()
	}

	var wg sync.WaitGroup
	sender := func(s int, bulk bool) {
		defer wg.Done()
		failures := 0
		for seq := 0; failures < 3 && !stop.Load(); {
			n := 1
			if bulk {
				n = diskFullBulkMsgs
			}
			msgs := make([]*mq.Message, n)
			for i := range msgs {
				msgs[i] = &mq.Message{Key: diskFullKey(s), Body: diskFullBody(s, seq+i, tc.bodySize(s))}
				if bulk {
					msgs[i].ToPartition(0)
				} else if tc.bulk > 0 {
					msgs[i].ToPartition(1 + s%(tc.parts-1)) // away from the bulk partition
				}
			}
			sctx, cancel := context.WithTimeout(ctx, diskFullWait)
			t0 := time.Now()
			res, err := p.SendMessage(sctx, msgs...)
			cancel()
			if err != nil {
				// A failed send is not acknowledged, not even in
				// part: its messages are not printed.
				report("err", s, failures > 0, t0, err)
				failures++
				continue
			}
			if failures > 0 {
				fail("sender %d: a send was acknowledged after a failed one: the failure is not sticky", s)
			}
			for i, r := range res {
				say("ack %d %d %d %d", s, seq+i, r.Partition, r.Offset)
			}
			seq += n
		}
	}
	s := 0
	for range tc.keyed {
		wg.Add(1)
		go sender(s, false)
		s++
	}
	for range tc.bulk {
		wg.Add(1)
		go sender(s, true)
		s++
	}
	if tc.tx {
		wg.Add(1)
		go func() {
			defer wg.Done()
			failures := 0
			for seq := 0; failures < 3 && !stop.Load(); seq++ {
				sctx, cancel := context.WithTimeout(ctx, diskFullWait)
				t0 := time.Now()
				err := host.Run(sctx, func(ctx context.Context) error {
					msg := &mq.Message{ID: "tx-" + strconv.Itoa(seq), Key: "tx", Body: []byte("tx")}
					return p.CommitMessage(ctx, msg.ToPartition(tc.parts-1))
				})
				cancel()
				if err != nil {
					report("txerr", -1, failures > 0, t0, err)
					failures++
					continue
				}
				say("txack %d", seq)
			}
		}()
	}
	waited := make(chan struct{})
	go func() {
		wg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-time.After(20 * time.Second):
		say("nolimit")
		stop.Store(true)
		<-waited
	}
	closeDiskFullChild(m, say)
	exit()
}

// closeDiskFullChild closes m, failing the child if Close hangs.
func closeDiskFullChild(m *mq.MQ, say func(string, ...any)) {
	t0 := time.Now()
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		msg, sf := "", 0
		if err != nil {
			msg = err.Error()
		}
		if errors.Is(err, mq.ErrStorageFailed) {
			sf = 1
		}
		say("close %d %d %q", time.Since(t0).Milliseconds(), sf, msg)
	case <-time.After(diskFullWait):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		fmt.Fprintf(os.Stderr, "disk full child: Close hung for %v\n%s", diskFullWait, buf[:n])
		os.Exit(4)
	}
}

// diskFullSizes lists the files of dir, largest first (for failure
// messages).
func diskFullSizes(dir string) string {
	var files []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				rel, _ := filepath.Rel(dir, path)
				files = append(files, fmt.Sprintf("%s=%d", rel, info.Size()))
			}
		}
		return nil
	})
	sort.Strings(files)
	return strings.Join(files, " ")
}
