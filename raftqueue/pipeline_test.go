package raftqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/testlog"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/store"
)

// A node's Close once waited forever in raft's Shutdown (in CI, a Raft3
// node whose disk failed): hashicorp/raft v1.7.3's pipeline
// replication deadlocks when a follower answers an AppendEntries with
// Success=false over a healthy connection, as a follower whose log write
// fails does (hashicorp/raft#612). With MaxRPCsInFlight 2 (raft's default)
// both channels of a netPipeline are unbuffered. On the rejection
// pipelineDecode returns (replication.go:557, or 550 for a newer term) and
// closes finishCh: nothing reads the pipeline's doneCh any more. The SEND
// loop of pipelineReplicate (replication.go:475) selects between the
// closed finishCh and a ready triggerCh (the leader appends all the time):
// when it picks triggerCh, pipelineSend hands one more request to
// decodeResponses, which decodes its answer and parks on doneCh
// (net_transport.go:852); the next pipelineSend (replication.go:520) parks
// on inprogressCh (net_transport.go:885). Their only other way out is the
// pipeline's shutdownCh, closed by pipeline.Close, which pipelineReplicate
// defers (replication.go:456). The follower gets heartbeats and never
// another entry, and the leader's Shutdown waits for the replicate
// goroutine forever. transport.NewRaftTransport, every node's raft
// transport, replicates without the pipeline.

// flakyLog is a replica's raft log whose writes fail while failing is
// set, without writing: a disk error that passes (the follower answers
// Success=false over a healthy connection).
type flakyLog struct {
	hookedLog
	failing atomic.Bool
	fails   atomic.Int64
	delay   atomic.Int64 // ns each write waits first: a slow disk, so that the leader's pipeline to it fills
}

func newFlakyLog(l raft.LogStore) *flakyLog {
	f := &flakyLog{}
	f.hookedLog = hookedLog{LogStore: l, before: f.before}
	return f
}

func (l *flakyLog) before() error {
	if d := l.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	if l.failing.Load() {
		l.fails.Add(1)
		return errors.New("write: file too large")
	}
	return nil
}

// pipelineReplica is one replica of openPipelineGroup's group.
type pipelineReplica struct {
	g     *Group
	wal   *store.WAL
	log   *flakyLog
	layer *tcpLayer
}

// openPipelineGroup opens a group of three replicas over TCP with the raft
// configuration internal/replica.OpenGroup gives a node's group, and its
// transport (transport.NewRaftTransport), or with stock, raft's default
// one.
func openPipelineGroup(t *testing.T, stock bool, lines *raftLines) []*pipelineReplica {
	t.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Output: lines, Level: hclog.Info})
	base := t.TempDir()
	rs := make([]*pipelineReplica, 3)
	var servers []raft.Server
	for i := range rs {
		l, err := listenTCP("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = &pipelineReplica{layer: l}
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(fmt.Sprintf("r%d", i)), Address: raft.ServerAddress(l.Addr().String())})
	}
	for i, r := range rs {
		var trans *raft.NetworkTransport
		if stock {
			trans = raft.NewNetworkTransport(r.layer, 3, 10*time.Second, io.Discard)
		} else {
			trans = transport.NewRaftTransport(r.layer).NetworkTransport
		}
		conf := raft.DefaultConfig() // as OpenGroup
		conf.MaxAppendEntries = 256
		conf.CommitTimeout = conf.HeartbeatTimeout / 2
		conf.TrailingLogs, conf.SnapshotThreshold = 1024, 2048
		dir := filepath.Join(base, fmt.Sprintf("r%d", i))
		w, wl, err := openNodeLog(filepath.Join(dir, "wal"))
		if err != nil {
			t.Fatal(err)
		}
		r.wal, r.log = w, newFlakyLog(wl)
		r.g, err = Open(Config{ID: servers[i].ID, Dir: dir, Transport: trans, LogStore: r.log, Raft: conf, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := rs[0].g.Bootstrap(servers); err != nil {
		t.Fatal(err)
	}
	return rs
}

// raftLines counts the lines of raft's log that tell the pipeline's story.
type raftLines struct {
	mu sync.Mutex
	n  map[string]int
}

var raftLineKeys = []string{"pipelining replication", "aborting pipeline replication", "failed to pipeline",
	"appendEntries rejected", "failed to append to logs"}

func (c *raftLines) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range raftLineKeys {
		if bytes.Contains(p, []byte(k)) {
			c.n[k]++
		}
	}
	return len(p), nil
}

func (c *raftLines) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.n)
}

// lastIndex is replica r's last raft index.
func (r *pipelineReplica) lastIndex() uint64 { return r.g.Raft().LastIndex() }

// raftStacks returns the goroutines running raft's replication or the
// pipeline, and Group.Close.
func raftStacks() string {
	return testlog.Goroutines(func(s string) bool {
		return strings.Contains(s, "raft.(*netPipeline)") || strings.Contains(s, "raft.(*Raft).pipeline") ||
			strings.Contains(s, "raftqueue.(*Group).Close")
	})
}

// testFollowerRejects makes the follower's log writes fail for a moment,
// again and again, under load; after each it must catch up with the
// leader, and the leader's Close must return.
func testFollowerRejects(t *testing.T, stock bool) {
	lines := &raftLines{n: map[string]int{}}
	rs := openPipelineGroup(t, stock, lines)
	leader := -1
	for deadline := time.Now().Add(patience); leader < 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for i, r := range rs {
			if r.g.State() == raft.Leader {
				leader = i
			}
		}
	}
	if leader < 0 {
		t.Fatal("no leader")
	}
	ld, fl := rs[leader], rs[(leader+1)%3]
	fl.log.delay.Store(int64(5 * time.Millisecond))
	leaderClosed := false
	t.Cleanup(func() {
		for _, r := range rs {
			if r == ld && !leaderClosed {
				continue // its raft may still run: its WAL stays open
			}
			r.g.Close()
			r.wal.Close()
		}
	})

	// The leader appends all the time, so that its replication is
	// triggered all the time.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var acked atomic.Int64
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ctx.Err() == nil; j++ {
				id := fmt.Sprintf("w%d-%d", w, j)
				m := store.Message{ID: id, Key: "k", Body: bytes.Repeat([]byte{'x'}, 1024), Timestamp: t0}
				if _, err := ld.g.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{m}}); err == nil {
					acked.Add(1)
				} else if ctx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	stopLoad := func() {
		cancel()
		wg.Wait()
	}
	defer stopLoad()

	// The follower's disk fails for a moment, again and again: each time
	// it answers Success=false on the leader's pipeline (once the leader
	// is back in pipeline mode after it caught up). After each, it must
	// catch up with the leader.
	stuck := false
	cycles := 0
	for ; cycles < 40 && !stuck; cycles++ {
		before := fl.log.fails.Load()
		fl.log.failing.Store(true)
		for deadline := time.Now().Add(2 * time.Second); fl.log.fails.Load() == before && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
		fl.log.failing.Store(false)
		target := ld.lastIndex()
		deadline := time.Now().Add(15 * time.Second)
		for fl.lastIndex() < target && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if fl.lastIndex() < target {
			stuck = true
			t.Logf("cycle %d: the follower stopped at index %d, the leader is at %d and still leads (state %v, follower's leader %v): "+
				"it gets heartbeats and no entry", cycles, fl.lastIndex(), ld.lastIndex(), ld.g.State(), func() raft.ServerID { _, id := fl.g.Leader(); return id }())
		}
	}
	stopLoad()
	t.Logf("raft logged %v", lines)
	t.Logf("%d cycles, %d commands acked, the follower's log failed %d writes", cycles, acked.Load(), fl.log.fails.Load())

	// The leader's Close must return: raft's RPCs end within their 10 s
	// timeout.
	closed := make(chan error, 1)
	go func() { closed <- ld.g.Close() }()
	select {
	case err := <-closed:
		leaderClosed = true
		if err != nil {
			t.Errorf("leader's Close: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the leader's Close (raft Shutdown) still waits after 60 s; its replication goroutines:\n\n%s", raftStacks())
	}
	if stuck {
		t.Errorf("the follower stopped getting entries, and the leader's Close returned")
	}
}

// TestGroup_FollowerRejectsThenCatchesUp: with a node's raft transport, a
// follower whose log writes fail for a moment, forty times under load,
// catches up after each, and the leader's Close returns. With raft's
// default transport (pipeline replication) the follower stopped within ten
// failures and the leader's Close never returned
// (TestGroup_FollowerRejectsStockTransport).
func TestGroup_FollowerRejectsThenCatchesUp(t *testing.T) { testFollowerRejects(t, false) }

// TestGroup_FollowerRejectsStockTransport is the negative control of
// TestGroup_FollowerRejectsThenCatchesUp, run with
// ZEZE_RAFT_NEGATIVE=1: it must fail (the follower stops getting entries,
// the leader's Close waits forever, the test gives up after 60 s and
// leaves raft's goroutines parked).
func TestGroup_FollowerRejectsStockTransport(t *testing.T) {
	if os.Getenv("ZEZE_RAFT_NEGATIVE") == "" {
		t.Skip("a negative control, expected to fail: ZEZE_RAFT_NEGATIVE=1 runs it")
	}
	testFollowerRejects(t, true)
}
