package mq_test

// Hostile review of the cluster under network faults and a paused node
// (issue 11, left item 4): SIGSTOP of a node longer than its session,
// one-way and flapping links. Each test says which promise it attacks.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// Environment of the paused node's child process (TestAttack_PausedNodeChild).
const (
	pauseDirEnv  = "ZEZE_MQ_PAUSE_DIR"  // the child's data directory; empty: not a child
	pauseSeedEnv = "ZEZE_MQ_PAUSE_SEED" // seed addresses, comma-separated
	pauseKPEnv   = "ZEZE_MQ_PAUSE_KP"   // the consumer's WithKeyParallel (0: one by one)
)

// netDelivery is one handler call: which node ran it, on what, and when
// (wall clock, unix ns: the child and the test share the machine's clock).
type netDelivery struct {
	node       string
	part       int
	off        int64
	key, id    string
	start, end int64
}

// netLog records the handler calls of every node.
type netLog struct {
	mu sync.Mutex
	ds []netDelivery
}

func (l *netLog) add(d netDelivery) {
	l.mu.Lock()
	l.ds = append(l.ds, d)
	l.mu.Unlock()
}

func (l *netLog) all() []netDelivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ds)
}

// netHandler is slow work (d per message) that ends with its ctx, as
// OnMessage must in a cluster; every call is recorded by rec.
func netHandler(node string, d time.Duration, rec func(netDelivery)) mq.Listener {
	return mq.ListenerFunc(func(ctx context.Context, _ string, m *mq.Message) error {
		start := time.Now().UnixNano()
		t := time.NewTimer(d)
		defer t.Stop()
		var err error
		select {
		case <-t.C:
		case <-ctx.Done():
			err = ctx.Err()
		}
		rec(netDelivery{node: node, part: m.PartitionIndex, off: m.Offset, key: m.Key, id: m.ID, start: start, end: time.Now().UnixNano()})
		return err
	})
}

func (d netDelivery) String() string {
	return fmt.Sprintf("%s p%d off %d key %s [%s, %s]", d.node, d.part, d.off, d.key,
		time.Unix(0, d.start).Format("15:04:05.000000"), time.Unix(0, d.end).Format("15:04:05.000000"))
}

func parseNetDelivery(line string) (netDelivery, bool) {
	f := strings.Fields(line)
	if len(f) != 8 || f[0] != "D" {
		return netDelivery{}, false
	}
	var d netDelivery
	var err error
	d.node = f[1]
	p, err1 := strconv.Atoi(f[2])
	d.off, err = strconv.ParseInt(f[3], 10, 64)
	d.key, d.id = f[4], f[5]
	s, err2 := strconv.ParseInt(f[6], 10, 64)
	e, err3 := strconv.ParseInt(f[7], 10, 64)
	if err != nil || err1 != nil || err2 != nil || err3 != nil {
		return netDelivery{}, false
	}
	d.part, d.start, d.end = p, s, e
	return d, true
}

// checkOwners fails t if two nodes ran handlers of one partition at once;
// exempt(d) exempts a call (a handler frozen with its process).
func checkOwners(t *testing.T, ds []netDelivery, exempt func(netDelivery) bool) {
	t.Helper()
	byPart := map[int][]netDelivery{}
	for _, d := range ds {
		if !exempt(d) {
			byPart[d.part] = append(byPart[d.part], d)
		}
	}
	bad := 0
	for p, l := range byPart {
		sort.Slice(l, func(i, j int) bool { return l[i].start < l[j].start })
		// Sweep: the furthest end so far of each node.
		ends := map[string]netDelivery{}
		for _, d := range l {
			for node, o := range ends {
				if node != d.node && o.end > d.start {
					if bad < 10 {
						t.Errorf("partition %d delivered by two nodes at once: %v began while %v ran", p, d, o)
					}
					bad++
				}
			}
			if o, ok := ends[d.node]; !ok || d.end > o.end {
				ends[d.node] = d
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d handler calls overlapped another node's on their partition", bad)
	}
}

// checkKeyOrder fails t if, for a key, the first delivery of a message
// began before the first delivery of an earlier message of that key
// (redeliveries may go back; a first delivery never overtakes).
func checkKeyOrder(t *testing.T, ds []netDelivery) {
	t.Helper()
	first := map[string]netDelivery{} // by id
	for _, d := range ds {
		if f, ok := first[d.id]; !ok || d.start < f.start {
			first[d.id] = d
		}
	}
	byKey := map[string][]netDelivery{}
	for _, d := range first {
		byKey[d.key] = append(byKey[d.key], d)
	}
	bad := 0
	for k, l := range byKey {
		sort.Slice(l, func(i, j int) bool { return l[i].off < l[j].off })
		for i := 1; i < len(l); i++ {
			if l[i].start < l[i-1].start {
				if bad < 10 {
					t.Errorf("key %s: %v was first delivered before %v", k, l[i], l[i-1])
				}
				bad++
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d first deliveries overtook an earlier message of their key", bad)
	}
}

// TestAttack_PausedNodeChild is node n3 of TestAttack_PausedNode, in a
// child process: it joins, consumes group g of topic t and prints each
// handler call; it closes when its standard input ends.
func TestAttack_PausedNodeChild(t *testing.T) {
	dir := os.Getenv(pauseDirEnv)
	if dir == "" {
		t.Skip("child of TestAttack_PausedNode")
	}
	kp, _ := strconv.Atoi(os.Getenv(pauseKPEnv))
	m, err := mq.Open(dir, mq.WithCluster(mq.ClusterConfig{
		NodeID: "n3", Bind: "127.0.0.1:0", Seeds: strings.Split(os.Getenv(pauseSeedEnv), ","), Secret: clusterSecret,
		SessionTimeout: time.Second, ElectionTimeout: 200 * time.Millisecond,
	}))
	if err != nil {
		t.Fatal(err)
	}
	var outMu sync.Mutex
	rec := func(d netDelivery) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf("D %s %d %d %s %s %d %d\n", d.node, d.part, d.off, d.key, d.id, d.start, d.end)
	}
	waitFor(t, 20*time.Second, "topic t", func() bool { return m.Topics()["t"] > 0 })
	var opts []mq.ConsumerOption
	if kp > 0 {
		opts = append(opts, mq.WithKeyParallel(kp))
	}
	c, err := m.NewConsumer("t", "g", netHandler("n3", 20*time.Millisecond, rec), opts...)
	if err != nil {
		t.Fatal(err)
	}
	outMu.Lock()
	fmt.Println("READY")
	outMu.Unlock()
	io.Copy(io.Discard, os.Stdin)
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	if err := m.Close(); err != nil {
		t.Error(err)
	}
}

// TestAttack_PausedNode attacks promise 5 (at most one owner of a partition
// per group delivers at a time), and that nothing acked is lost and
// per-key order holds, across a node paused longer than its session.
//
// n1 and n2 (this process) hold topic t's partitions; n3, a child process,
// consumes group g beside n2's consumer, with a slow handler and a
// backlog. n3 is stopped (SIGSTOP) for 3 session timeouts: the leader
// marks it down, n2's consumer takes its partitions once their leases
// lapsed. n3 is then continued (SIGCONT): its handlers frozen mid-call end,
// and it must not begin another call of a partition n2 now delivers.
func TestAttack_PausedNode(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kp      int
		backlog int // messages per key before the pause
		idle    bool
	}{
		{"OneByOne", 0, 15, false},
		{"KeyParallel", 16, 30, false},
		// n3 waits in a fetch when it stops; the messages come during the pause.
		{"OneByOneIdle", 0, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testPausedNode(t, tc.kp, tc.backlog, tc.idle) })
	}
}

func testPausedNode(t *testing.T, kp, backlog int, idle bool) {
	c := newReviewCluster(t, 2, time.Second) // lease 500 ms
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const parts = 4
	if err := c.nodes["n1"].CreateMQ(ctx, "t", parts, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["t"] == parts })
	}
	log := &netLog{}
	var opts []mq.ConsumerOption
	if kp > 0 {
		opts = append(opts, mq.WithKeyParallel(kp))
	}
	cons, err := c.nodes["n2"].NewConsumer("t", "g", netHandler("n2", 20*time.Millisecond, log.add), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()

	// n3, in a child process.
	seeds := c.nodes["n1"].ClusterStatus().Addr + "," + c.nodes["n2"].ClusterStatus().Addr
	cmd := exec.Command(os.Args[0], "-test.run=^TestAttack_PausedNodeChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), pauseDirEnv+"="+filepath.Join(c.root, "n3"), pauseSeedEnv+"="+seeds, pauseKPEnv+"="+strconv.Itoa(kp))
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	ready := make(chan struct{})
	var other []string
	go func() {
		defer close(exited)
		br := bufio.NewReader(stdout)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if d, ok := parseNetDelivery(line); ok {
				log.add(d)
			} else if line == "READY\n" {
				close(ready)
			} else {
				other = append(other, line)
			}
		}
	}()
	childDone := false
	defer func() {
		if !childDone {
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			<-exited
			cmd.Wait()
		}
	}()
	select {
	case <-ready:
	case <-exited:
		t.Fatalf("child ended: %s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("child not ready in 30 s: %s", stderr.String())
	}
	c.waitUp(3)

	// A backlog: 64 keys over the partitions, sent in parallel by key.
	p, err := c.nodes["n1"].NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	const keys = 64
	var ackMu sync.Mutex
	acked := map[string]bool{}
	send := func(prefix string, perKey int) {
		var wg sync.WaitGroup
		for k := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perKey {
					id := fmt.Sprintf("%s-k%02d-%04d", prefix, k, i)
					sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
					_, err := p.SendMessage(sctx, &mq.Message{ID: id, Key: fmt.Sprintf("k%02d", k), Body: []byte("x")})
					scancel()
					if err != nil {
						t.Errorf("send %s: %v", id, err)
						return
					}
					ackMu.Lock()
					acked[id] = true
					ackMu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	send("a", backlog)
	if t.Failed() {
		t.FailNow()
	}
	// n3 delivers some of its share (all of it, idle).
	waitFor(t, 20*time.Second, "n3 delivering", func() bool {
		n := 0
		for _, d := range log.all() {
			if d.node == "n3" {
				n++
			}
		}
		return n >= min(20, backlog*keys/4)
	})
	if idle {
		waitFor(t, 20*time.Second, "the backlog delivered", func() bool { return len(log.all()) >= backlog*keys })
		time.Sleep(100 * time.Millisecond) // into the next fetch
	}
	stopAt := time.Now().UnixNano()
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if idle {
		send("p", 5) // to n3's fetches, and to n2 once it takes over
	}
	time.Sleep(time.Until(time.Unix(0, stopAt).Add(3 * time.Second)))
	contAt := time.Now().UnixNano()
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	all := func() bool {
		got := map[string]bool{}
		for _, d := range log.all() {
			got[d.id] = true
		}
		ackMu.Lock()
		defer ackMu.Unlock()
		for id := range acked {
			if !got[id] {
				return false
			}
		}
		return true
	}
	waitFor(t, 30*time.Second, "every acked message delivered", all)
	// n3 rejoins: it is up again and its consumer gets partitions back.
	c.waitUp(3)
	rejoined := func() bool {
		for _, d := range log.all() {
			if d.node == "n3" && d.start > contAt {
				return true
			}
		}
		return false
	}
	for i := 0; !rejoined(); i++ {
		if i == 40 {
			t.Fatalf("n3 delivered nothing in the 20 s after its resume")
		}
		send(fmt.Sprintf("b%d", i), 1)
		time.Sleep(500 * time.Millisecond)
	}
	waitFor(t, 30*time.Second, "every acked message delivered", all)

	stdin.Close()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not end 30 s after its input closed")
	}
	err = cmd.Wait()
	childDone = true
	if err != nil || strings.Contains(stderr.String(), "DATA RACE") {
		t.Errorf("child: %v; stderr:\n%s", err, stderr.String())
	}
	if len(other) > 0 {
		t.Logf("child printed: %q", other)
	}
	ds := log.all()
	frozen := func(d netDelivery) bool { return d.node == "n3" && d.start < contAt && d.end > stopAt }
	checkOwners(t, ds, frozen)
	checkKeyOrder(t, ds)
	n3 := 0
	for _, d := range ds {
		if d.node == "n3" && d.start > contAt {
			n3++
		}
	}
	t.Logf("%d handler calls, %d by n3 after its resume", len(ds), n3)
}

// lockedBuffer is a bytes buffer safe for a child's stderr copier and the
// test reading it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
