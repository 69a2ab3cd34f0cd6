package mq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// The transaction crash matrix re-executes the test binary as a child that
// runs a few transactions and then SIGKILLs itself at one point of one more
// transaction. These variables select the child mode and its cell.
const (
	txCrashDirEnv     = "ZEZE_MQ_TXCRASH_DIR"
	txCrashAdapterEnv = "ZEZE_MQ_TXCRASH_ADAPTER" // one of txCrashAdapters
	txCrashAPIEnv     = "ZEZE_MQ_TXCRASH_API"     // "prepare" or "commit"
	txCrashPointEnv   = "ZEZE_MQ_TXCRASH_POINT"   // "a", "b" or "c"
	txCrashCycleEnv   = "ZEZE_MQ_TXCRASH_CYCLE"
	// txCrashCyclesEnv sets the cycles per cell; by default 50 on bbolt
	// (10 with -short) and 10 on a server.
	txCrashCyclesEnv = "ZEZE_MQ_TXCRASH_CYCLES"
	txCrashTopic     = "txcrash"
)

// txCrashAdapters are the host adapters of the matrix, as txtest names
// them: bbolt, and the SQL adapter on a PostgreSQL and a MySQL/MariaDB
// server (a server's cells are skipped, saying so, when txtest finds it
// not configured, and fail when ZEZE_SQL_SERVERS=required).
var txCrashAdapters = []string{"bolt", "postgres", "mysql"}

// txCrashPoints maps a cell's point to the transaction hook where the child
// kills itself:
//
//	a: after PrepareMessage/CommitMessage, before the local commit
//	b: after the local commit, before the queue's commit
//	c: during the queue's commit: on odd cycles once one of the two
//	   partitions is committed, on even cycles 0-3ms after the first
//	   partition's commit is handed to its writer
var txCrashPoints = map[string]string{"a": "sent", "b": "local-committed", "c": "partition-committed"}

// TestTransaction_CrashMatrix kills a transacting child process with
// SIGKILL at each crash point, for PrepareMessage and for CommitMessage,
// many cycles per cell on one directory (and, on a server, one set of
// tables), then reopens them and checks against the host store: no
// message of an uncommitted transaction is visible, none of a committed
// one is lost, none is stored twice. Each host adapter has its cells,
// named adapter/api/point.
func TestTransaction_CrashMatrix(t *testing.T) {
	if dir := os.Getenv(txCrashDirEnv); dir != "" {
		cycle, _ := strconv.Atoi(os.Getenv(txCrashCycleEnv))
		txCrashChild(t, dir, os.Getenv(txCrashAdapterEnv), os.Getenv(txCrashAPIEnv), os.Getenv(txCrashPointEnv), cycle) // never returns
	}
	override := 0
	if s := os.Getenv(txCrashCyclesEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", txCrashCyclesEnv, s)
		}
		override = n
	}
	for _, adapter := range txCrashAdapters {
		cycles := 10 // a server's cycles are slower; keep the suite fast
		if adapter == "bolt" && !testing.Short() {
			cycles = 50
		}
		if override != 0 {
			cycles = override
		}
		for _, api := range []string{"prepare", "commit"} {
			for _, point := range []string{"a", "b", "c"} {
				// One level, as the cells were before the adapters: go
				// test -v lists each at the same depth.
				t.Run(adapter+"/"+api+"/"+point, func(t *testing.T) {
					runTxCrashCell(t, adapter, api, point, cycles)
				})
			}
		}
	}
}

// runTxCrashCell runs the cycles of one cell, then verifies.
func runTxCrashCell(t *testing.T, adapter, api, point string, cycles int) {
	dir := t.TempDir()
	if adapter != "bolt" {
		// Skips (or fails) before any child runs. The tables, created
		// here, are dropped at the end even when a cycle fails.
		txtest.Open(t, adapter, txCrashHostPath(dir))
	}
	t.Parallel()
	start := time.Now()
	for cycle := 1; cycle <= cycles; cycle++ {
		runTxCrashChild(t, dir, adapter, api, point, cycle)
	}
	r := verifyTxCrash(t, dir, adapter)
	cell := adapter + "/" + api + "/" + point
	t.Logf("%s: %d cycles in %v: invisible-uncommitted=%d lost-committed=%d duplicates=%d (committed txs %d, messages seen %d)",
		cell, cycles, time.Since(start).Round(time.Millisecond),
		r.invisibleUncommitted, r.lostCommitted, r.duplicates, r.committed, r.seen)
	if r.invisibleUncommitted != 0 || r.lostCommitted != 0 || r.duplicates != 0 {
		t.Errorf("%s: invisible-uncommitted=%d lost-committed=%d duplicates=%d, want all 0; %s",
			cell, r.invisibleUncommitted, r.lostCommitted, r.duplicates, r.detail)
	}
	if r.committed < 2*cycles {
		t.Errorf("%d committed transactions, want at least %d", r.committed, 2*cycles)
	}
}

// txCrashHostPath is the host store of the cell in dir: a bbolt file, or
// the name the server's tables are named after.
func txCrashHostPath(dir string) string { return filepath.Join(dir, "host") }

// runTxCrashChild runs one cycle and checks that the child killed itself.
func runTxCrashChild(t *testing.T, dir, adapter, api, point string, cycle int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTransaction_CrashMatrix$", "-test.count=1")
	cmd.Env = append(os.Environ(), txCrashDirEnv+"="+dir, txCrashAdapterEnv+"="+adapter, txCrashAPIEnv+"="+api,
		txCrashPointEnv+"="+point, txCrashCycleEnv+"="+strconv.Itoa(cycle))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%s/%s/%s cycle %d: child still running after 60s:\n%s", adapter, api, point, cycle, out.String())
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s/%s/%s cycle %d: child ended with %v, want killed by its SIGKILL:\n%s", adapter, api, point, cycle, cmd.ProcessState, out.String())
	}
}

// txCrashChild opens the host store of adapter and the node in dir, runs
// two committed transactions and a rolled back one, then one more that
// kills the process at point. Each transaction writes a business row named
// after it and sends one message to each of the topic's two partitions,
// with IDs label-0 and label-1. A host that cannot be opened fails the
// test: the child exits instead of being killed.
func txCrashChild(t *testing.T, dir, adapter, api, point string, cycle int) {
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "child %s/%s/%s cycle %d: %v\n", adapter, api, point, cycle, err)
		os.Exit(3)
	}
	hook, ok := txCrashPoints[point]
	if !ok || (api != "prepare" && api != "commit") {
		fail(fmt.Errorf("bad cell %q/%q", api, point))
	}
	host := txtest.Open(t, adapter, txCrashHostPath(dir))
	var crashID atomic.Value // the id of the transaction to die in
	crashID.Store("")
	async := point == "c" && cycle%2 == 0
	if async {
		hook = "partition-committing"
	}
	var once sync.Once
	hookFn := func(pt, txid string) {
		if pt != hook || txid != crashID.Load().(string) {
			return
		}
		if async { // somewhere inside the writer's commit and fsync
			once.Do(func() {
				go func() {
					time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
					syscall.Kill(os.Getpid(), syscall.SIGKILL)
				}()
			})
			return
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	m, err := mq.Open(filepath.Join(dir, "mq"), mq.WithLocalTx(host.Store), mq.WithTxCheckAfter(20*time.Millisecond), mq.WithTxTestHook(hookFn))
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	if err := m.CreateMQ(ctx, txCrashTopic, 2, mq.Options{}); err != nil && !errors.Is(err, mq.ErrTopicExists) {
		fail(err)
	}
	p, err := m.NewProducer(txCrashTopic)
	if err != nil {
		fail(err)
	}
	send := p.PrepareMessage
	if api == "commit" {
		send = p.CommitMessage
	}
	run := func(label string, crash bool, result error) error {
		return host.Run(ctx, func(ctx context.Context) error {
			if crash {
				tx, _ := localtx.FromContext(ctx)
				crashID.Store(tx.ID())
			}
			if err := host.Put(ctx, label, "1"); err != nil {
				return err
			}
			a := (&mq.Message{ID: label + "-0", Body: []byte(label)}).ToPartition(0)
			b := (&mq.Message{ID: label + "-1", Body: []byte(label)}).ToPartition(1)
			if err := send(ctx, a, b); err != nil {
				return err
			}
			return result
		})
	}
	for k := range 2 {
		if err := run(fmt.Sprintf("c%d-g%d", cycle, k), false, nil); err != nil {
			fail(err)
		}
	}
	errRollback := errors.New("rollback")
	if err := run(fmt.Sprintf("c%d-r", cycle), false, errRollback); !errors.Is(err, errRollback) {
		fail(fmt.Errorf("rolled back transaction: %v", err))
	}
	err = run(fmt.Sprintf("c%d-x", cycle), true, nil)
	if async {
		time.Sleep(5 * time.Second) // the kill is on its way
	}
	fail(fmt.Errorf("the crash point %s was not reached (Run: %v)", hook, err))
}

type txCrashResult struct {
	invisibleUncommitted, lostCommitted, duplicates int
	committed, seen                                 int
	detail                                          string
}

// verifyTxCrash reopens the host store of adapter and the node in dir
// after the last kill, lets the node repair what the crashes left (sweep
// and check-back), reads every message with a new group and compares with
// the committed business rows.
func verifyTxCrash(t *testing.T, dir, adapter string) txCrashResult {
	t.Helper()
	host := txtest.Open(t, adapter, txCrashHostPath(dir))
	m, err := mq.Open(filepath.Join(dir, "mq"), mq.WithLocalTx(host.Store), mq.WithTxCheckAfter(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	waitFor(t, 20*time.Second, "every transaction decided and every marker forgotten", func() bool {
		n, err := mq.PendingTxs(m)
		if err != nil {
			t.Fatal(err)
		}
		markers, err := host.Markers()
		if err != nil {
			t.Fatal(err)
		}
		return n == 0 && markers == 0
	})
	keys, err := host.Keys()
	if err != nil {
		t.Fatal(err)
	}
	committed := map[string]bool{}
	for _, k := range keys {
		committed[k] = true
	}
	col := collect(t, m, txCrashTopic, "verify")
	fence(t, m, col, txCrashTopic)
	var r txCrashResult
	var details []string
	r.committed = len(committed)
	seen := col.ids()
	for id, n := range seen {
		msg := col.byID(id)
		if string(msg.Body) == "fence" {
			continue
		}
		r.seen++
		label := id[:max(strings.LastIndexByte(id, '-'), 0)]
		if !committed[label] {
			r.invisibleUncommitted++
			details = append(details, "uncommitted "+id)
		}
		if n > 1 {
			r.duplicates += n - 1
			details = append(details, fmt.Sprintf("%s x%d", id, n))
		}
	}
	for label := range committed {
		for _, id := range []string{label + "-0", label + "-1"} {
			if seen[id] == 0 {
				r.lostCommitted++
				details = append(details, "lost "+id)
			}
		}
	}
	if len(details) > 20 {
		details = details[:20]
	}
	r.detail = strings.Join(details, ", ")
	return r
}
