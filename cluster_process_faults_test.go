package mq_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The process fault test: three cluster nodes, each a process of its own
// (cluster_process_node_test.go) on loopback, take sends from their own
// clients into a Raft3 and a DoubleWrite topic and deliver them to a
// consumer group, while a seeded schedule kills (SIGKILL) and restarts
// them, pauses them (SIGSTOP), closes them cleanly, cuts their links
// (both ways, or one way: what one node writes to another stalls),
// replaces a node's disk, replaces a node by a new one (added, then the old
// one drained, closed and removed, while the clients of every node go on;
// the old or the new one may be killed and restarted during the drain),
// moves a DoubleWrite follower to another node by hand
// and balances the leaders of the Raft3 groups and DoubleWrite pairs
// (BalanceLeaders; each partition has a group or pair of its own). One
// fault at a time; a disk or a node is replaced only while the cluster is
// whole (a second replica lost before the first caught up loses data by
// design). Then every fault heals, the senders stop, and the whole
// history is checked:
//
//   - every acknowledged message is stored once, at the partition and
//     offset of its ack, read through every node alike;
//   - a message only ever refused (definite errors) is not stored;
//   - one key's acknowledged messages are stored in the order sent;
//   - every acknowledged message reached the consumer group;
//   - no two processes ran handlers of one partition at once (each
//     handler takes a millisecond), but for a call held by a SIGSTOP.
//
// ZEZE_MQ_FAULT_SECONDS sets how long faults run (20 s by default, 10 s
// with -short), ZEZE_MQ_FAULT_SEED the schedule. The negative control
// runs the same with a broken build (acks before the commit, every
// consumer delivers every partition: faultinject) and must fail both
// checks.
const (
	pfR3    = "r3"
	pfDW    = "dw"
	pfParts = 2
)

func TestCluster_ProcessFaults(t *testing.T) {
	if env := os.Getenv(pnodeEnv); env != "" {
		runProcessNode(env) // never returns
	}
	parallelByDefault(t)
	if bad := runProcessFaults(t, pfSeconds(t), false); len(bad) > 0 {
		for _, b := range bad[:min(len(bad), 20)] {
			t.Error(b)
		}
		t.Fatalf("%d violations", len(bad))
	}
}

// TestCluster_ProcessFaultsNegativeControl: with every replicated partition
// acknowledging before the commit, the same schedule loses or misplaces
// acknowledged messages, and the check says so.
func TestCluster_ProcessFaultsNegativeControl(t *testing.T) {
	parallelByDefault(t)
	bad := runProcessFaults(t, pfSeconds(t), true)
	var owners, rest []string
	for _, b := range bad {
		if strings.Contains(b, pfAtOnce) {
			owners = append(owners, b)
		} else {
			rest = append(rest, b)
		}
	}
	if len(rest) == 0 {
		t.Error("the check found nothing wrong with a build that acknowledges before the commit")
	}
	if len(owners) == 0 {
		t.Error("the check of owners found nothing wrong with a build whose consumers all deliver every partition")
	}
	for _, b := range [][]string{rest, owners} {
		if len(b) > 0 {
			t.Logf("%d violations found, as the broken build must give; the first: %s", len(b), b[0])
		}
	}
}

func pfSeconds(t *testing.T) time.Duration {
	d := 20 * time.Second
	if testing.Short() {
		d = 10 * time.Second
	}
	if s := os.Getenv("ZEZE_MQ_FAULT_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("ZEZE_MQ_FAULT_SECONDS=%q: want a positive number", s)
		}
		d = time.Duration(n) * time.Second
	}
	return d
}

// pfAck is an acknowledged send.
type pfAck struct {
	topic string
	part  int
	off   int64
	key   string
	seq   int
}

// pfHistory is what every node process reported.
type pfHistory struct {
	mu       sync.Mutex
	acks     map[string]pfAck
	refused  map[string]int                 // ID → definite refusals
	unknown  map[string]int                 // ID → unknown outcomes
	received map[string]int                 // ID → deliveries to the group
	handled  map[string][]pfCall            // "topic/part" → its handler calls
	paused   map[string][][2]int64          // process (node.run) → its SIGSTOP spans
	dumps    map[string]map[string][]string // node → topic → "part off id" lines
	bad      []string                       // lines no one expected
}

func (h *pfHistory) record(node, line string) bool {
	f := strings.Fields(line)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case len(f) == 7 && f[0] == "ack":
		part, e1 := strconv.Atoi(f[3])
		off, e2 := strconv.ParseInt(f[4], 10, 64)
		seq, e3 := strconv.Atoi(f[6])
		if e1 != nil || e2 != nil || e3 != nil {
			h.bad = append(h.bad, node+": "+line)
			return true
		}
		a := pfAck{topic: f[2], part: part, off: off, key: f[5], seq: seq}
		if prev, ok := h.acks[f[1]]; ok && prev != a {
			h.bad = append(h.bad, fmt.Sprintf("%s acked twice, at %s/%d@%d and %s/%d@%d", f[1], prev.topic, prev.part, prev.off, a.topic, a.part, a.off))
		}
		h.acks[f[1]] = a
	case len(f) >= 2 && f[0] == "refused":
		h.refused[f[1]]++
	case len(f) == 2 && f[0] == "unknown":
		h.unknown[f[1]]++
	case len(f) == 8 && f[0] == "recv":
		h.received[f[1]]++
		begin, e1 := strconv.ParseInt(f[6], 10, 64)
		end, e2 := strconv.ParseInt(f[7], 10, 64)
		if e1 != nil || e2 != nil {
			h.bad = append(h.bad, node+": "+line)
			return true
		}
		k := f[3] + "/" + f[4]
		h.handled[k] = append(h.handled[k], pfCall{owner: f[2], begin: begin, end: end})
	case len(f) == 5 && f[0] == "msg":
		if h.dumps[node] == nil {
			h.dumps[node] = map[string][]string{}
		}
		h.dumps[node][f[1]] = append(h.dumps[node][f[1]], strings.Join(f[2:], " "))
	default:
		return false
	}
	return true
}

// pfProc is one run of a node process.
type pfProc struct {
	id      string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan string
	done    chan struct{} // its stdout ended
	stderr  *lockedBuffer
	addr    string
}

// pfCluster runs the node processes.
type pfCluster struct {
	t      *testing.T
	root   string
	broken bool
	certs  map[string]string // node → nodeCertsEnv setting
	hist   *pfHistory
	runs   map[string]int
	procs  map[string]*pfProc // the running ones
	booted bool
}

func (c *pfCluster) start(id string) {
	t := c.t
	t.Helper()
	var seeds []string
	for other, p := range c.procs {
		if other != id {
			seeds = append(seeds, p.addr)
		}
	}
	c.runs[id]++
	cfg := pnodeConfig{ID: id, Dir: filepath.Join(c.root, id), Seeds: seeds, Bootstrap: !c.booted,
		Run: c.runs[id], Broken: c.broken, Session: 2 * time.Second}
	c.booted = true
	b, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCluster_ProcessFaults$", "-test.count=1")
	cmd.Env = append(os.Environ(), pnodeEnv+"="+string(b), c.certs[id])
	p := &pfProc{id: id, cmd: cmd, replies: make(chan string, 64), done: make(chan struct{}), stderr: &lockedBuffer{}}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		br := bufio.NewReader(stdout)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return // a line without its '\n' was cut by a kill
			}
			line = strings.TrimSuffix(line, "\n")
			if !c.hist.record(id, line) {
				select {
				case p.replies <- line:
				default:
					c.hist.mu.Lock()
					c.hist.bad = append(c.hist.bad, id+": reply not read: "+line)
					c.hist.mu.Unlock()
				}
			}
		}
	}()
	addr := c.await(p, "addr ", 60*time.Second)
	p.addr = strings.TrimPrefix(addr, "addr ")
	c.procs[id] = p
}

// await returns p's next reply starting with prefix; other replies before
// it fail the test.
func (c *pfCluster) await(p *pfProc, prefix string, d time.Duration) string {
	c.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case line := <-p.replies:
			if strings.HasPrefix(line, prefix) {
				return line
			}
			c.t.Fatalf("%s: %q while waiting for %q; stderr:\n%s", p.id, line, prefix, p.stderr)
		case <-p.done:
			p.cmd.Wait()
			c.t.Fatalf("%s ended (%v) while waiting for %q; stderr:\n%s", p.id, p.cmd.ProcessState, prefix, p.stderr)
		case <-timeout:
			// SIGQUIT: the process prints its goroutines on its way out.
			p.cmd.Process.Signal(syscall.SIGCONT)
			p.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
			}
			c.t.Fatalf("%s: no %q within %v; stderr:\n%s", p.id, prefix, d, p.stderr)
		}
	}
}

func (c *pfCluster) tell(id, format string, args ...any) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.procs[id].stdin, format+"\n", args...); err != nil {
		c.t.Fatalf("%s: command: %v", id, err)
	}
}

// kill ends node id's process with SIGKILL.
func (c *pfCluster) kill(id string) {
	c.t.Helper()
	p := c.procs[id]
	delete(c.procs, id)
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Kill()
	<-p.done
	p.cmd.Wait()
	c.checkRace(p)
}

// closeClean closes node id's node and waits for its process to exit.
func (c *pfCluster) closeClean(id string) {
	c.t.Helper()
	p := c.procs[id]
	c.tell(id, "close")
	c.await(p, "closed", 3*time.Minute)
	delete(c.procs, id)
	<-p.done
	if err := p.cmd.Wait(); err != nil {
		c.t.Fatalf("%s: exit after close: %v; stderr:\n%s", id, err, p.stderr)
	}
	c.checkRace(p)
}

func (c *pfCluster) checkRace(p *pfProc) {
	if s := p.stderr.String(); strings.Contains(s, "WARNING: DATA RACE") {
		c.t.Fatalf("%s: data race in the node process:\n%s", p.id, s)
	}
}

// work starts node id's senders and consumers.
func (c *pfCluster) work(id string) {
	for _, tp := range []string{pfR3, pfDW} {
		c.tell(id, "send %s 2", tp)
		c.tell(id, "consume %s", tp)
	}
}

// whole reports whether every running node says the cluster is whole:
// the nodes of ids, each running.
func (c *pfCluster) whole(ids []string) (bool, string) {
	if len(c.procs) < len(ids) {
		return false, fmt.Sprintf("%d nodes running", len(c.procs))
	}
	for id, p := range c.procs {
		c.tell(id, "status %d", len(ids))
		if s := c.await(p, "status ", time.Minute); s != "status ok" {
			return false, id + ": " + s
		}
	}
	return true, ""
}

func (c *pfCluster) awaitWhole(ids []string, d time.Duration) (bool, string) {
	var why string
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		var ok bool
		if ok, why = c.whole(ids); ok {
			return true, ""
		}
	}
	return false, why
}

// runProcessFaults runs the fault schedule for d and returns what the
// check of its history found wrong.
func runProcessFaults(t *testing.T, d time.Duration, broken bool) []string {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("ZEZE_MQ_FAULT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d (ZEZE_MQ_FAULT_SEED), faults for %v", seed, d)
	ids := []string{"n1", "n2", "n3"}
	c := &pfCluster{t: t, root: t.TempDir(), broken: broken, certs: map[string]string{}, runs: map[string]int{},
		procs: map[string]*pfProc{},
		hist: &pfHistory{acks: map[string]pfAck{}, refused: map[string]int{}, unknown: map[string]int{},
			received: map[string]int{}, dumps: map[string]map[string][]string{},
			handled: map[string][]pfCall{}, paused: map[string][][2]int64{}}}
	for _, id := range ids {
		c.certs[id] = nodeCertsDir(t, id)
	}
	t.Cleanup(func() {
		for id := range c.procs {
			p := c.procs[id]
			p.cmd.Process.Signal(syscall.SIGCONT)
			p.cmd.Process.Kill()
			<-p.done
			p.cmd.Wait()
		}
	})
	for _, id := range ids {
		c.start(id)
	}
	if ok, why := c.awaitWhole(ids, time.Minute); !ok {
		t.Fatalf("the cluster did not form: %s", why)
	}
	c.tell("n1", "create %s raft3 %d", pfR3, pfParts)
	c.await(c.procs["n1"], "created", 2*time.Minute)
	c.tell("n1", "create %s doublewrite %d", pfDW, pfParts)
	c.await(c.procs["n1"], "created", 2*time.Minute)
	if ok, why := c.awaitWhole(ids, time.Minute); !ok {
		t.Fatalf("the topics did not settle: %s", why)
	}
	for _, id := range ids {
		c.work(id)
	}

	pick := func() string { return ids[rng.IntN(len(ids))] }
	hold := func() time.Duration { return time.Duration(300+rng.IntN(3000)) * time.Millisecond }
	restart := func(id string) {
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
		c.start(id)
		c.work(id)
	}
	link := func(x, y string, down int) { // both ways
		c.tell(x, "cut %s %d", y, down)
		c.tell(y, "cut %s %d", x, down)
	}
	// ZEZE_MQ_FAULT_KINDS (numbers of the cases below, comma-separated)
	// narrows the schedule to those kinds, to chase one.
	var only []int
	for _, f := range strings.FieldsFunc(os.Getenv("ZEZE_MQ_FAULT_KINDS"), func(r rune) bool { return r == ',' }) {
		k, err := strconv.Atoi(f)
		if err != nil || k < 0 || k > 9 {
			t.Fatalf("ZEZE_MQ_FAULT_KINDS=%q: want numbers 0 to 9", os.Getenv("ZEZE_MQ_FAULT_KINDS"))
		}
		only = append(only, k)
	}
	faults, added := 0, 0
	for end := time.Now().Add(d); time.Now().Before(end); faults++ {
		x := pick()
		k := rng.IntN(10)
		if len(only) > 0 {
			k = only[k%len(only)]
		}
		switch k {
		case 0:
			t.Logf("fault %d: kill -9 %s", faults, x)
			c.kill(x)
			restart(x)
		case 1:
			h := hold()
			t.Logf("fault %d: SIGSTOP %s for %v", faults, x, h)
			p := c.procs[x]
			from := time.Now().UnixNano()
			p.cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(h)
			p.cmd.Process.Signal(syscall.SIGCONT)
			c.hist.pause(fmt.Sprintf("%s.%d", x, c.runs[x]), from, time.Now().UnixNano())
		case 2:
			t.Logf("fault %d: close %s cleanly", faults, x)
			c.closeClean(x)
			restart(x)
		case 3, 7:
			y := pick()
			for y == x {
				y = pick()
			}
			h := hold()
			if k == 3 {
				t.Logf("fault %d: cut %s-%s for %v", faults, x, y, h)
				link(x, y, 1)
				time.Sleep(h)
				link(x, y, 0)
				break
			}
			t.Logf("fault %d: cut %s→%s one way for %v", faults, x, y, h)
			c.tell(x, "mute %s 1", y)
			time.Sleep(h)
			c.tell(x, "mute %s 0", y)
		case 4:
			h := hold()
			t.Logf("fault %d: isolate %s for %v", faults, x, h)
			isolate := func(down int) {
				for _, y := range ids {
					if y != x {
						link(x, y, down)
					}
				}
			}
			isolate(1)
			time.Sleep(h)
			isolate(0)
		case 5:
			if ok, why := c.awaitWhole(ids, 30*time.Second); !ok {
				t.Logf("fault %d: no disk replaced, the cluster is not whole: %s", faults, why)
				continue
			}
			t.Logf("fault %d: replace %s's disk", faults, x)
			c.kill(x)
			if err := os.RemoveAll(filepath.Join(c.root, x)); err != nil {
				t.Fatal(err)
			}
			restart(x)
		case 8:
			if ok, why := c.awaitWhole(ids, 30*time.Second); !ok {
				t.Logf("fault %d: no node replaced, the cluster is not whole: %s", faults, why)
				continue
			}
			added++
			nid := fmt.Sprintf("n%d", 3+added)
			via := pick()
			for via == x {
				via = pick()
			}
			// The drained node or the new one may crash in the middle.
			crash := []string{"", x, nid}[rng.IntN(3)]
			t.Logf("fault %d: add %s, drain %s through %s (crashing %q), close and remove it", faults, nid, x, via, crash)
			c.certs[nid] = nodeCertsDir(t, nid)
			c.start(nid)
			c.work(nid)
			c.tell(via, "drain %s", x)
			if crash != "" {
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
				c.kill(crash)
				restart(crash)
			}
			if got := c.await(c.procs[via], "drained "+x, 4*time.Minute); got != "drained "+x+" <nil>" {
				t.Fatalf("fault %d: %s", faults, got)
			}
			c.closeClean(x)
			c.tell(via, "remove %s", x)
			if got := c.await(c.procs[via], "removed "+x, 3*time.Minute); got != "removed "+x+" <nil>" {
				t.Fatalf("fault %d: %s", faults, got)
			}
			ids[slices.Index(ids, x)] = nid
		case 9:
			part := rng.IntN(pfParts)
			c.tell(x, "move %s %d", pfDW, part)
			t.Logf("fault %d: %s moves the follower of %s/%d: %s", faults, x, pfDW, part, c.await(c.procs[x], "moved", time.Minute))
		case 6:
			c.tell(x, "balance")
			t.Logf("fault %d: %s balances the leaders: %s", faults, x, c.await(c.procs[x], "balanced", time.Minute))
		}
		time.Sleep(time.Duration(200+rng.IntN(1000)) * time.Millisecond)
	}

	t.Logf("%d faults; healing", faults)
	if ok, why := c.awaitWhole(ids, 3*time.Minute); !ok {
		t.Errorf("the cluster did not heal within 3 minutes: %s", why)
	}
	for _, id := range ids {
		c.tell(id, "stop")
	}
	for _, id := range ids {
		c.await(c.procs[id], "stopped", 2*time.Minute)
	}
	for _, id := range ids {
		for _, tp := range []string{pfR3, pfDW} {
			c.tell(id, "dump %s %d", tp, pfParts)
			c.await(c.procs[id], "dumped "+tp, 3*time.Minute)
		}
	}
	h := c.hist
	delivered := func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for id := range h.acks {
			if h.received[id] == 0 {
				return false
			}
		}
		return true
	}
	// The check reports what is still not delivered after a minute: a
	// broken build's lost messages never are.
	for end := time.Now().Add(time.Minute); !delivered() && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t.Logf("%d acked, %d refused, %d unknown outcomes, %d delivered", len(h.acks), len(h.refused), len(h.unknown), len(h.received))
	return checkProcessHistory(h, ids)
}

// checkProcessHistory checks h, its lock held; see the file's comment.
func checkProcessHistory(h *pfHistory, ids []string) []string {
	bad := slices.Clone(h.bad)
	want := h.dumps[ids[0]]
	for _, id := range ids[1:] {
		for _, tp := range []string{pfR3, pfDW} {
			if !slices.Equal(h.dumps[id][tp], want[tp]) {
				bad = append(bad, fmt.Sprintf("%s read through %s holds %d messages, through %s %d", tp, id, len(h.dumps[id][tp]), ids[0], len(want[tp])))
			}
		}
	}
	type place struct {
		topic string
		part  int
		off   int64
	}
	stored := map[string][]place{}
	for tp, lines := range want {
		for _, l := range lines {
			var p place
			var id string
			if _, err := fmt.Sscanf(l, "%d %d %s", &p.part, &p.off, &id); err != nil {
				bad = append(bad, "dump line "+l)
				continue
			}
			p.topic = tp
			stored[id] = append(stored[id], p)
		}
	}
	byKey := map[string][]pfAck{}
	for id, a := range h.acks {
		at := stored[id]
		switch {
		case len(at) == 0:
			bad = append(bad, fmt.Sprintf("acked %s (%s/%d@%d) not stored", id, a.topic, a.part, a.off))
		case len(at) > 1:
			bad = append(bad, fmt.Sprintf("acked %s stored %d times: %v", id, len(at), at))
		case at[0] != place{a.topic, a.part, a.off}:
			bad = append(bad, fmt.Sprintf("acked %s at %s/%d@%d, stored at %v", id, a.topic, a.part, a.off, at[0]))
		}
		if h.received[id] == 0 {
			bad = append(bad, fmt.Sprintf("acked %s never delivered to the group", id))
		}
		byKey[a.key] = append(byKey[a.key], a)
	}
	for id := range h.refused {
		if _, acked := h.acks[id]; !acked && h.unknown[id] == 0 && len(stored[id]) > 0 {
			bad = append(bad, fmt.Sprintf("%s refused (definite, %d times) but stored at %v", id, h.refused[id], stored[id]))
		}
	}
	for key, as := range byKey {
		slices.SortFunc(as, func(a, b pfAck) int { return a.seq - b.seq })
		for i := 1; i < len(as); i++ {
			if as[i].part != as[i-1].part || as[i].off <= as[i-1].off {
				bad = append(bad, fmt.Sprintf("key %s: seq %d at %d@%d, seq %d at %d@%d", key, as[i-1].seq, as[i-1].part, as[i-1].off, as[i].seq, as[i].part, as[i].off))
			}
		}
	}
	bad = append(bad, checkProcessOwners(h)...)
	slices.Sort(bad)
	return bad
}

// pfCall is a handler call of the consumer group: which process (node.run)
// made it, and when it began and ended, in Unix nanoseconds.
type pfCall struct {
	owner      string
	begin, end int64
}

func (h *pfHistory) pause(owner string, from, to int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.paused[owner] = append(h.paused[owner], [2]int64{from, to})
}

// pfAtOnce marks checkOwners' violations.
const pfAtOnce = "handled at once"

// checkProcessOwners reports the handler calls of one partition by two
// processes that overlap (overlaps), leaving out a call its process was
// paused in (a SIGSTOP may hold a handler that began within its lease for
// any time). A worker begins no call past its lease, and another owner's
// claim waits the lease out, so no other two may overlap.
func checkProcessOwners(h *pfHistory) []string {
	var bad []string
	for part, calls := range h.handled {
		calls = slices.DeleteFunc(slices.Clone(calls), func(c pfCall) bool {
			for _, span := range h.paused[c.owner] {
				if span[0] < c.end && c.begin < span[1] {
					return true
				}
			}
			return false
		})
		for _, o := range overlaps(calls, func(c pfCall) (string, int64, int64) { return c.owner, c.begin, c.end }) {
			bad = append(bad, fmt.Sprintf("%s %s by %s and %s: a call of %s began %v before %s's ended",
				part, pfAtOnce, o[0].owner, o[1].owner, o[1].owner, time.Duration(o[0].end-o[1].begin), o[0].owner))
		}
	}
	return bad
}
