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

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
)

// The transaction crash matrix re-executes the test binary as a child that
// runs a few transactions and then SIGKILLs itself at one point of one more
// transaction. These variables select the child mode and its cell.
const (
	txCrashDirEnv    = "ZEZE_MQ_TXCRASH_DIR"
	txCrashAPIEnv    = "ZEZE_MQ_TXCRASH_API"   // "prepare" or "commit"
	txCrashPointEnv  = "ZEZE_MQ_TXCRASH_POINT" // "a", "b" or "c"
	txCrashCycleEnv  = "ZEZE_MQ_TXCRASH_CYCLE"
	txCrashCyclesEnv = "ZEZE_MQ_TXCRASH_CYCLES" // cycles per cell; default 50 (10 with -short)
	txCrashTopic     = "txcrash"
)

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
// many cycles per cell on one directory, then reopens the directory and
// checks against the host store: no message of an uncommitted transaction
// is visible, none of a committed one is lost, none is stored twice.
func TestTransaction_CrashMatrix(t *testing.T) {
	if dir := os.Getenv(txCrashDirEnv); dir != "" {
		cycle, _ := strconv.Atoi(os.Getenv(txCrashCycleEnv))
		txCrashChild(dir, os.Getenv(txCrashAPIEnv), os.Getenv(txCrashPointEnv), cycle) // never returns
	}
	cycles := 50
	if testing.Short() {
		cycles = 10
	}
	if s := os.Getenv(txCrashCyclesEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", txCrashCyclesEnv, s)
		}
		cycles = n
	}
	for _, api := range []string{"prepare", "commit"} {
		for _, point := range []string{"a", "b", "c"} {
			t.Run(api+"/"+point, func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				dir := t.TempDir()
				for cycle := 1; cycle <= cycles; cycle++ {
					runTxCrashChild(t, dir, api, point, cycle)
				}
				r := verifyTxCrash(t, dir)
				t.Logf("%s/%s: %d cycles in %v: invisible-uncommitted=%d lost-committed=%d duplicates=%d (committed txs %d, messages seen %d)",
					api, point, cycles, time.Since(start).Round(time.Millisecond),
					r.invisibleUncommitted, r.lostCommitted, r.duplicates, r.committed, r.seen)
				if r.invisibleUncommitted != 0 || r.lostCommitted != 0 || r.duplicates != 0 {
					t.Errorf("%s/%s: invisible-uncommitted=%d lost-committed=%d duplicates=%d, want all 0; %s",
						api, point, r.invisibleUncommitted, r.lostCommitted, r.duplicates, r.detail)
				}
				if r.committed < 2*cycles {
					t.Errorf("%d committed transactions, want at least %d", r.committed, 2*cycles)
				}
			})
		}
	}
}

// runTxCrashChild runs one cycle and checks that the child killed itself.
func runTxCrashChild(t *testing.T, dir, api, point string, cycle int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTransaction_CrashMatrix$", "-test.count=1")
	cmd.Env = append(os.Environ(), txCrashDirEnv+"="+dir, txCrashAPIEnv+"="+api,
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
		t.Fatalf("%s/%s cycle %d: child still running after 60s:\n%s", api, point, cycle, out.String())
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s/%s cycle %d: child ended with %v, want killed by its SIGKILL:\n%s", api, point, cycle, cmd.ProcessState, out.String())
	}
}

var txCrashBusiness = []byte("business")

// txCrashChild opens the host DB and the node in dir, runs two committed
// transactions and a rolled back one, then one more that kills the process
// at point. Each transaction writes a business row named after it and sends
// one message to each of the topic's two partitions, with IDs label-0 and
// label-1.
func txCrashChild(dir, api, point string, cycle int) {
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "child %s/%s cycle %d: %v\n", api, point, cycle, err)
		os.Exit(3)
	}
	hook, ok := txCrashPoints[point]
	if !ok || (api != "prepare" && api != "commit") {
		fail(fmt.Errorf("bad cell %q/%q", api, point))
	}
	db, err := bolt.Open(filepath.Join(dir, "host.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		fail(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(txCrashBusiness)
		return err
	}); err != nil {
		fail(err)
	}
	host, err := localtx.NewBolt(db, localtx.BoltOptions{})
	if err != nil {
		fail(err)
	}
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
	m, err := mq.Open(filepath.Join(dir, "mq"), mq.WithLocalTx(host), mq.WithTxCheckAfter(20*time.Millisecond), mq.WithTxTestHook(hookFn))
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
			if err := host.Tx(ctx).Bucket(txCrashBusiness).Put([]byte(label), []byte("1")); err != nil {
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

// verifyTxCrash reopens dir after the last kill, lets the node repair what
// the crashes left (sweep and check-back), reads every message with a new
// group and compares with the committed business rows.
func verifyTxCrash(t *testing.T, dir string) txCrashResult {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "host.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	host, err := localtx.NewBolt(db, localtx.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := mq.Open(filepath.Join(dir, "mq"), mq.WithLocalTx(host), mq.WithTxCheckAfter(10*time.Millisecond))
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
		markers := 0
		db.View(func(tx *bolt.Tx) error {
			markers = tx.Bucket(localtx.MarkerBucket).Stats().KeyN
			return nil
		})
		return n == 0 && markers == 0
	})
	committed := map[string]bool{}
	db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(txCrashBusiness).ForEach(func(k, _ []byte) error {
			committed[string(k)] = true
			return nil
		})
	})
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
