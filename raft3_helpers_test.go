package mq_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// r3 is the Raft3 topic of the Raft3 tests.
const r3 = "r"

// createR3 creates r3 with parts partitions on c and waits until every
// node sees it.
func createR3(t *testing.T, c *testCluster, parts int) {
	t.Helper()
	createR3With(t, c, parts, mq.Options{Type: mq.Raft3})
}

// createR3With is createR3 with opts.
func createR3With(t *testing.T, c *testCluster, parts int, opts mq.Options) {
	t.Helper()
	c.createTopic(r3, parts, opts)
}

// leaderAndOthers returns the leader of partition 0 of r3 on c and c's
// other open nodes.
func leaderAndOthers(t *testing.T, c *testCluster) (lead string, others []string) {
	t.Helper()
	lead = leaderOf(t, c, 0)
	return lead, othersThan(c, lead)
}

// testCtx returns the ctx of a test's calls: 60 s at most.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// leaderOf waits until the open nodes holding a replica of partition i of
// r3 agree on an open leader, and returns it.
func leaderOf(t testing.TB, c *testCluster, i int) string {
	t.Helper()
	var leader string
	waitFor(t, 20*time.Second, fmt.Sprintf("a leader of %s/%d", r3, i), func() bool {
		leader = ""
		for _, m := range c.nodes {
			l, holds := mq.Raft3Leader(m, r3, i)
			if !holds {
				continue
			}
			if l == "" || c.nodes[l] == nil || (leader != "" && l != leader) {
				return false
			}
			leader = l
		}
		return leader != ""
	})
	return leader
}

// waitReadable waits until m reads offset 0 of every partition of r3
// (each holds a message): its view of the groups works.
func waitReadable(t testing.TB, m *mq.MQ, parts int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range parts {
		waitFor(t, 30*time.Second, fmt.Sprintf("%s/%d readable", r3, i), func() bool {
			_, err := m.ReadMessage(ctx, r3, i, 0)
			return err == nil
		})
	}
}

// bounded runs fn and fails t, with every goroutine's stack, when it has
// not returned within d: a hang.
func bounded(t testing.TB, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		var b bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&b, 2)
		t.Fatalf("%s did not return within %v: a hang\n%s", what, d, b.String())
	}
}

// sendAgain sends msgs through p, again while the outcome is unknown (the
// same messages: their IDs and partitions make the resend store each
// once).
func sendAgain(ctx context.Context, p *mq.Producer, msgs ...*mq.Message) ([]mq.SendResult, error) {
	for {
		res, err := p.SendMessage(ctx, msgs...)
		if !errors.Is(err, mq.ErrUnknownOutcome) {
			return res, err
		}
	}
}

// prepareAgain is sendAgain for PrepareMessage.
func prepareAgain(ctx context.Context, p *mq.Producer, msgs ...*mq.Message) error {
	for {
		if err := p.PrepareMessage(ctx, msgs...); !errors.Is(err, mq.ErrUnknownOutcome) {
			return err
		}
	}
}

// alterAgain is m.AlterMQ, again while the outcome is unknown (a
// metadata leader lost while committing): growing to the count the topic
// has is a no-op.
func alterAgain(ctx context.Context, m *mq.MQ, topic string, partitions int) error {
	for {
		if err := m.AlterMQ(ctx, topic, partitions); !errors.Is(err, mq.ErrUnknownOutcome) {
			return err
		}
	}
}

// ledger is what the senders were told: each ack, each key's acked
// messages in send order, and every ID sent, acked or not.
type ledger struct {
	mu    sync.Mutex
	acked map[string]mq.SendResult // by ID
	byKey map[string][]string
	sent  map[string]bool
	acks  map[string]int // by sender
}

func newLedger() *ledger {
	return &ledger{acked: map[string]mq.SendResult{}, byKey: map[string][]string{}, sent: map[string]bool{}, acks: map[string]int{}}
}

// count returns the acks of sender.
func (l *ledger) count(sender string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acks[sender]
}

// ids returns the acked IDs.
func (l *ledger) ids() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id := range l.acked {
		out = append(out, id)
	}
	return out
}

// sendOne sends msg through p, again while its outcome is unknown (the
// same message: its ID and partition make the resend store it once), and
// records the ack.
func (l *ledger) sendOne(ctx context.Context, p *mq.Producer, sender string, msg *mq.Message) error {
	l.mu.Lock()
	l.sent[msg.ID] = true
	l.mu.Unlock()
	res, err := sendAgain(ctx, p, msg)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acked[msg.ID] = res[0]
	l.byKey[msg.Key] = append(l.byKey[msg.Key], msg.ID)
	l.acks[sender]++
	return nil
}

// sendLoop sends sender-0, sender-1, ... through m, one at a time, until
// stop closes or m closes (ErrClosed ends it quietly): message j to
// partition j%parts, keyed sender/j%parts. Any other error fails t.
func (l *ledger) sendLoop(ctx context.Context, t testing.TB, m *mq.MQ, sender string, parts int, stop <-chan struct{}) {
	p, err := m.NewProducer(r3)
	if err != nil {
		if !errors.Is(err, mq.ErrClosed) {
			t.Errorf("NewProducer on %s: %v", sender, err)
		}
		return
	}
	for j := 0; ; j++ {
		select {
		case <-stop:
			return
		default:
		}
		msg := (&mq.Message{ID: fmt.Sprintf("%s-%d", sender, j), Key: fmt.Sprintf("%s/%d", sender, j%parts), Body: []byte(sender)}).ToPartition(j % parts)
		if err := l.sendOne(ctx, p, sender, msg); err != nil {
			if !errors.Is(err, mq.ErrClosed) {
				t.Errorf("send %s through %s: %v", msg.ID, sender, err)
			}
			return
		}
	}
}

// sendFrom starts a sendLoop through each of ids' nodes; the function it
// returns stops them and waits.
func (l *ledger) sendFrom(ctx context.Context, t testing.TB, c *testCluster, parts int, ids ...string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, id := range ids {
		m := c.nodes[id]
		wg.Go(func() { l.sendLoop(ctx, t, m, id, parts, done) })
	}
	return func() {
		close(done)
		wg.Wait()
	}
}

// atLeast returns a condition: each of senders has n acks or more.
func (l *ledger) atLeast(n int, senders ...string) func() bool {
	return func() bool {
		for _, s := range senders {
			if l.count(s) < n {
				return false
			}
		}
		return true
	}
}

// check reads every message of r3 through m and checks it against the
// ledger: each acked message stored once, at the partition and offset of
// its ack, each key's in send order, and nothing stored that was never
// sent (but IDs starting with "x-", sent outside the ledger).
func (l *ledger) check(t testing.TB, m *mq.MQ, parts int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	where := map[string][]string{}
	for i := range parts {
		for off := int64(0); ; off++ {
			msg, err := m.ReadMessage(ctx, r3, i, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				t.Fatalf("read %s/%d at %d: %v", r3, i, off, err)
			}
			if !l.sent[msg.ID] && !strings.HasPrefix(msg.ID, "x-") {
				t.Errorf("%s stored at %d/%d, never sent", msg.ID, i, off)
			}
			where[msg.ID] = append(where[msg.ID], fmt.Sprintf("%d/%d", i, off))
		}
	}
	for id, res := range l.acked {
		want := fmt.Sprintf("%d/%d", res.Partition, res.Offset)
		if got := where[id]; len(got) != 1 || got[0] != want {
			t.Errorf("%s acked at %s, stored at %v", id, want, got)
		}
	}
	for key, ids := range l.byKey {
		for k := 1; k < len(ids); k++ {
			if a, b := l.acked[ids[k-1]], l.acked[ids[k]]; a.Partition != b.Partition || a.Offset >= b.Offset {
				t.Errorf("key %s: %s acked at %d/%d, then %s at %d/%d", key, ids[k-1], a.Partition, a.Offset, ids[k], b.Partition, b.Offset)
			}
		}
	}
}

// orderly is a group's listener that records its deliveries and what
// breaks Orderly delivery from the start of each partition: an offset
// delivered before every offset below it was (a redelivery from the last
// committed offset after a failover is at least once, and allowed).
type orderly struct {
	mu     sync.Mutex
	next   map[int]int64       // by partition: one past the highest offset delivered
	seen   map[string]int      // by ID: deliveries
	at     map[string]string   // by ID: partition/offset delivered at
	firsts map[string][]string // by key: IDs in the order of their first delivery
	broken []string
}

func newOrderly() *orderly {
	return &orderly{next: map[int]int64{}, seen: map[string]int{}, at: map[string]string{}, firsts: map[string][]string{}}
}

func (o *orderly) OnMessage(_ context.Context, _ string, m *mq.Message) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := m.PartitionIndex
	if m.Offset > o.next[p] {
		o.broken = append(o.broken, fmt.Sprintf("%s at %d/%d delivered before %d/%d", m.ID, p, m.Offset, p, o.next[p]))
	}
	o.next[p] = max(o.next[p], m.Offset+1)
	if o.seen[m.ID] == 0 {
		o.firsts[m.Key] = append(o.firsts[m.Key], m.ID)
	}
	o.seen[m.ID]++
	o.at[m.ID] = fmt.Sprintf("%d/%d", p, m.Offset)
	return nil
}

func (o *orderly) count(id string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[id]
}

// consume opens a consumer of group g on each of ids' nodes, all with
// listener o, closed when the test ends, and returns them.
func (o *orderly) consume(t testing.TB, c *testCluster, ids ...string) []*mq.Consumer {
	t.Helper()
	var out []*mq.Consumer
	for _, id := range ids {
		cons, err := c.nodes[id].NewConsumer(r3, "g", o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cons.Close() })
		out = append(out, cons)
	}
	return out
}

// waitAll waits until every message acked in l was delivered at least
// once, then checks the deliveries against l.
func (o *orderly) waitAll(t testing.TB, l *ledger) {
	t.Helper()
	ids := l.ids()
	waitFor(t, 30*time.Second, fmt.Sprintf("delivery of %d acked messages", len(ids)), func() bool {
		for _, id := range ids {
			if o.count(id) == 0 {
				return false
			}
		}
		return true
	})
	o.check(t, l)
}

// check checks the deliveries against l: every acked message delivered,
// at its acked place, each key's first deliveries in send order, nothing
// never sent, Orderly unbroken.
func (o *orderly) check(t testing.TB, l *ledger) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range o.broken {
		t.Errorf("order broken: %s", b)
	}
	for id, res := range l.acked {
		if want := fmt.Sprintf("%d/%d", res.Partition, res.Offset); o.at[id] != want {
			t.Errorf("%s acked at %s, delivered at %q", id, want, o.at[id])
		}
	}
	for id := range o.seen {
		if !l.sent[id] && !strings.HasPrefix(id, "x-") {
			t.Errorf("%s delivered, never sent", id)
		}
	}
	for key, want := range l.byKey {
		var got []string
		for _, id := range o.firsts[key] {
			if _, ok := l.acked[id]; ok {
				got = append(got, id)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("key %s first delivered as %v, sent as %v", key, got, want)
		}
	}
}

// delayedAcrossFailover sends three delayed messages to each of the parts
// partitions of r3 through lead, closes lead around the first one's time,
// and checks that a consumer on others[0] gets each once, no earlier than
// its time, from its partition, and that each is stored once, in its
// partition, as others[1] reads them.
func delayedAcrossFailover(t *testing.T, c *testCluster, lead string, others []string, parts int) {
	t.Helper()
	ctx := testCtx(t)
	var mu sync.Mutex
	got := map[string]time.Time{}
	from := map[string]int{}
	cons, err := c.nodes[others[0]].NewConsumer(r3, "g", mq.ListenerFunc(func(_ context.Context, _ string, m *mq.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := got[m.ID]; !ok {
			got[m.ID] = time.Now()
			from[m.ID] = m.PartitionIndex
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cons.Close() })
	p, err := c.nodes[lead].NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	due := map[string]time.Time{}
	want := map[string]int{}
	for i := range parts {
		for k, d := range []time.Duration{300, 1200, 2500} { // the first around the close
			id := fmt.Sprintf("x-%d-%d", i, k)
			due[id], want[id] = now.Add(d*time.Millisecond+time.Duration(i)*20*time.Millisecond), i
			res, err := p.SendMessage(ctx, (&mq.Message{ID: id, DeliverAt: due[id]}).ToPartition(i))
			if err != nil {
				t.Fatal(err)
			}
			if !res[0].Delayed || res[0].Offset != -1 || res[0].Partition != i {
				t.Fatalf("%s delayed: %+v", id, res[0])
			}
		}
	}
	time.Sleep(time.Until(now.Add(300 * time.Millisecond)))
	c.kill(lead)
	waitFor(t, 20*time.Second, "every delayed message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == len(due)
	})
	mu.Lock()
	for id, at := range due {
		if got[id].Before(at) {
			t.Errorf("%s delivered at %v, %v before its time", id, got[id].Format(time.StampMilli), at.Sub(got[id]))
		}
		if from[id] != want[id] {
			t.Errorf("%s delivered from partition %d, sent to %d", id, from[id], want[id])
		}
	}
	mu.Unlock()
	stored := map[string][]int{}
	for i := range parts {
		for off := int64(0); ; off++ {
			m, err := c.nodes[others[1]].ReadMessage(ctx, r3, i, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			stored[m.ID] = append(stored[m.ID], i)
		}
	}
	for id, i := range want {
		if len(stored[id]) != 1 || stored[id][0] != i {
			t.Errorf("%s (to partition %d) stored in %v", id, i, stored[id])
		}
	}
}

// r3Leaders returns the leader of each of r3's parts partitions, waiting
// until the open nodes of c holding a replica agree on it.
func r3Leaders(t testing.TB, c *testCluster, parts int) []string {
	t.Helper()
	out := make([]string, parts)
	for i := range parts {
		out[i] = leaderOf(t, c, i)
	}
	return out
}

// holders returns the open nodes of c holding a replica of r3/i, sorted.
func holders(c *testCluster, i int) []string {
	var out []string
	for id, m := range c.nodes {
		if _, holds := mq.Raft3Leader(m, r3, i); holds {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// sameGroupLeaders waits until, as every open node of c sees it, each
// group of r3 (a list of its partitions) has one leader for all its
// partitions.
func sameGroupLeaders(t testing.TB, c *testCluster, groups [][]int) {
	t.Helper()
	waitFor(t, 30*time.Second, "one leader per raft group", func() bool {
		for _, m := range c.nodes {
			for _, g := range groups {
				first, holds := mq.Raft3Leader(m, r3, g[0])
				if !holds {
					continue // a node without a replica of the group
				}
				if first == "" {
					return false
				}
				for _, i := range g[1:] {
					if l, _ := mq.Raft3Leader(m, r3, i); l != first {
						return false
					}
				}
			}
		}
		return true
	})
}

// senders runs k sendLoops through each of ids' nodes of c, named id,
// tag and a letter; the function returned stops them and waits.
func senders(ctx context.Context, t testing.TB, l *ledger, c *testCluster, parts, k int, tag string, ids ...string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, id := range ids {
		m := c.nodes[id]
		for j := range k {
			name := fmt.Sprintf("%s%s%c", id, tag, 'a'+j)
			wg.Go(func() { l.sendLoop(ctx, t, m, name, parts, done) })
		}
	}
	return func() {
		close(done)
		wg.Wait()
	}
}

// total returns the acks of every sender in l.
func (l *ledger) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// nodeChild is a node run by TestRaft3NodeChild.
type nodeChild struct {
	t      testing.TB
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *lockedBuffer
	exited chan struct{} // closed once its standard output ended
	done   bool
}

// startNodeChild starts node id of c on its directory in a child process,
// joining through c's open nodes, with env added to its environment.
func startNodeChild(t testing.TB, c *testCluster, id string, parts int, env ...string) *nodeChild {
	t.Helper()
	var seeds []string
	for other, m := range c.nodes {
		if other != id {
			seeds = append(seeds, m.ClusterStatus().Addr)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRaft3NodeChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), r3nodeDirEnv+"="+filepath.Join(c.root, id), r3nodeIDEnv+"="+id,
		r3nodeSeedsEnv+"="+strings.Join(seeds, ","), r3nodePartsEnv+"="+strconv.Itoa(parts), nodeCertsDir(t, id))
	cmd.Env = append(cmd.Env, env...)
	ch := &nodeChild{t: t, id: id, cmd: cmd, lines: make(chan string, 4096), stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = ch.stderr
	var err error
	if ch.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(ch.exited)
		br := bufio.NewReader(stdout)
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				ch.lines <- strings.TrimSuffix(line, "\n")
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(ch.kill)
	return ch
}

// kill ends the child with SIGKILL (if it still runs) and reaps it.
func (ch *nodeChild) kill() {
	if ch.done {
		return
	}
	ch.done = true
	ch.cmd.Process.Kill()
	<-ch.exited
	ch.cmd.Wait()
}

// tail is the end of the child's standard error.
func (ch *nodeChild) tail() string {
	s := ch.stderr.String()
	if i := strings.Index(s, "panic:"); i >= 0 {
		s = s[i:]
	} else if i := strings.Index(s, "fatal error:"); i >= 0 {
		s = s[i:]
	} else if len(s) > 3000 {
		s = s[len(s)-3000:]
	}
	if len(s) > 4000 {
		s = s[:4000]
	}
	return s
}

// expect waits up to d for a line starting with one of prefixes, skipping
// others, and returns it; the child ending or d passing fails the test.
func (ch *nodeChild) expect(d time.Duration, prefixes ...string) string {
	ch.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case line := <-ch.lines:
			for _, p := range prefixes {
				if strings.HasPrefix(line, p) {
					return line
				}
			}
		case <-ch.exited:
			// What it printed before ending.
			for {
				select {
				case line := <-ch.lines:
					for _, p := range prefixes {
						if strings.HasPrefix(line, p) {
							return line
						}
					}
					continue
				default:
				}
				break
			}
			ch.cmd.Wait()
			ch.done = true
			ch.t.Fatalf("node %s (child) ended (%v) before saying %v:\n%s", ch.id, ch.cmd.ProcessState, prefixes, ch.tail())
		case <-timer.C:
			ch.t.Fatalf("node %s (child) said none of %v within %v: a hang\n%s", ch.id, prefixes, d, ch.tail())
		}
	}
}

// send writes a line to the child's standard input.
func (ch *nodeChild) send(line string) {
	ch.t.Helper()
	if _, err := io.WriteString(ch.stdin, line+"\n"); err != nil {
		ch.t.Fatalf("to node %s (child): %v", ch.id, err)
	}
}

// childRead is one message read through the child, or the error that ended
// a partition's reads.
type childRead struct {
	id  string
	crc uint32
	err string
}

// read reads every message of r3 through the child: by "p/off".
func (ch *nodeChild) read() map[string]childRead {
	ch.t.Helper()
	ch.send("read")
	out := map[string]childRead{}
	for {
		line := ch.expect(30*time.Second, "M ", "E ", "DONE")
		if line == "DONE" {
			return out
		}
		f := strings.SplitN(line, " ", 4)
		key := f[1] + "/" + f[2]
		if f[0] == "E" {
			out[key] = childRead{err: f[3]}
			continue
		}
		g := strings.Fields(f[3])
		crc, _ := strconv.ParseUint(g[1], 16, 32)
		out[key] = childRead{id: g[0], crc: uint32(crc)}
	}
}

// close closes the child's node (the end of its input) and fails the test
// if Close hangs, fails or leaves goroutines behind.
func (ch *nodeChild) close() {
	ch.t.Helper()
	ch.stdin.Close()
	line := ch.expect(40*time.Second, "CLOSED", "CLOSEHANG")
	if line == "CLOSEHANG" {
		ch.t.Errorf("Close of node %s (child) did not return within 20 s", ch.id)
	} else if line != "CLOSED <nil>" {
		ch.t.Logf("node %s (child): %s", ch.id, line)
	}
	if line := ch.expect(40*time.Second, "LEAK", "EXIT"); strings.HasPrefix(line, "LEAK") {
		ch.t.Errorf("node %s (child) left goroutines behind after Close: %.3000s", ch.id, line)
	}
	ch.kill()
}

// checkChildReads checks what the child read against l: every acked
// message at its acked place with its body; nothing never sent.
func checkChildReads(t testing.TB, l *ledger, got map[string]childRead) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, r := range got {
		if r.err != "" {
			t.Errorf("read through the child at %s: %s", key, r.err)
		}
	}
	for id, res := range l.acked {
		key := fmt.Sprintf("%d/%d", res.Partition, res.Offset)
		r := got[key]
		if r.id != id || r.crc != crc32.ChecksumIEEE(r3nodeBody(id)) {
			t.Errorf("%s acked at %s; read through the child there: %+v", id, key, r)
		}
	}
}

// verify reads every message of r3 through m and checks it against l
// (each acked message once, at its acked place, with its body; nothing
// never sent). It reports the first problems and their number with
// t.Errorf, and returns the number.
func verify(t testing.TB, what string, m *mq.MQ, parts int, l *ledger) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	var bad []string
	where := map[string][]string{}
	unreadable := map[string]bool{}
	for i := range parts {
		for off := int64(0); ; off++ {
			msg, err := m.ReadMessage(ctx, r3, i, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				bad = append(bad, fmt.Sprintf("at %d/%d: %v", i, off, err))
				unreadable[fmt.Sprintf("%d/%d", i, off)] = true
				if ctx.Err() != nil || !errors.Is(err, mq.ErrCorrupt) {
					break // no quorum, or worse: the rest of the partition too
				}
				continue
			}
			if !l.sent[msg.ID] {
				bad = append(bad, fmt.Sprintf("%s stored at %d/%d, never sent", msg.ID, i, off))
			} else if !bytes.Equal(msg.Body, r3nodeBody(msg.ID)) {
				bad = append(bad, fmt.Sprintf("%s at %d/%d read with a changed body (%d bytes: %.40q)", msg.ID, i, off, len(msg.Body), msg.Body))
			}
			where[msg.ID] = append(where[msg.ID], fmt.Sprintf("%d/%d", i, off))
		}
	}
	lost := 0
	for id, res := range l.acked {
		want := fmt.Sprintf("%d/%d", res.Partition, res.Offset)
		if got := where[id]; len(got) != 1 || got[0] != want {
			if !unreadable[want] {
				bad = append(bad, fmt.Sprintf("%s acked at %s, read at %v", id, want, got))
			}
			lost++
		}
	}
	for k, b := range bad {
		if k == 8 {
			t.Errorf("%s: ... %d problems in all", what, len(bad))
			break
		}
		t.Errorf("%s: %s", what, b)
	}
	if lost > 0 {
		t.Errorf("%s: %d of %d acked messages not read back at their acked offsets", what, lost, len(l.acked))
	}
	return len(bad) + lost
}

// sendN sends n messages prefix-0.. through m, message j to partition
// j%parts, each with r3nodeBody, recorded in l. ErrUnknownOutcome is sent
// again; any other error fails t.
func sendN(t testing.TB, l *ledger, m *mq.MQ, prefix string, n, parts int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := m.NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for j := range n {
		id := fmt.Sprintf("%s-%d", prefix, j)
		msg := (&mq.Message{ID: id, Key: fmt.Sprintf("%s/%d", prefix, j%parts), Body: r3nodeBody(id)}).ToPartition(j % parts)
		if err := l.sendOne(ctx, p, prefix, msg); err != nil {
			t.Fatalf("send %s: %v", id, err)
		}
	}
}

// leadersSeenBy returns the leader of each partition of r3 as m knows it,
// waiting until m knows one for each (which is not gone).
func leadersSeenBy(t testing.TB, m *mq.MQ, parts int, gone ...string) []string {
	t.Helper()
	out := make([]string, parts)
	waitFor(t, 20*time.Second, "a leader of every partition", func() bool {
		for i := range parts {
			l, _ := mq.Raft3Leader(m, r3, i)
			if l == "" || containsStr(gone, l) {
				return false
			}
			out[i] = l
		}
		return true
	})
	return out
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// replicaDir is the directory of node id's replica of the raft group of
// partition i of r3 (created with the default PartitionsPerRaftGroup).
func replicaDir(c *testCluster, id string, i int) string {
	first := i / mq.DefaultPartitionsPerRaftGroup * mq.DefaultPartitionsPerRaftGroup
	return filepath.Join(c.root, id, "raft3", r3, strconv.Itoa(first))
}

// partitionFile is the file of node id's replica of partition i of r3:
// partition.db in a group of its own, else in its group's directory.
func partitionFile(c *testCluster, id string, i int) string {
	if path := filepath.Join(c.root, id, "raft3", r3, strconv.Itoa(i), "partition.db"); fileExists(path) {
		return path
	}
	return filepath.Join(replicaDir(c, id, i), fmt.Sprintf("partition-%d.db", i%mq.DefaultPartitionsPerRaftGroup))
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// flipMarkers flips a byte inside every copy of the body marker of each
// of ids in path; it returns how many copies it changed.
func flipMarkers(t testing.TB, path string, ids ...string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, id := range ids {
		marker := []byte("BODY<" + id + ">")
		for at := 0; ; {
			k := bytes.Index(b[at:], marker)
			if k < 0 {
				break
			}
			b[at+k+2] ^= 0x20 // "BODY" -> "BoDY"
			at += k + len(marker)
			n++
		}
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return n
}

// damagedSetup starts three nodes with r3 of parts partitions, sends 60
// acked messages, and closes n3: its replicas hold them all.
func damagedSetup(t *testing.T, parts int) (*testCluster, *ledger) {
	t.Helper()
	return damagedSetupWith(t, parts, mq.Options{Type: mq.Raft3})
}

// damagedSetupWith is damagedSetup with r3 created with opts.
func damagedSetupWith(t *testing.T, parts int, opts mq.Options) (*testCluster, *ledger) {
	t.Helper()
	c := newCluster(t, 3)
	createR3With(t, c, parts, opts)
	for i := range parts {
		leaderOf(t, c, i)
	}
	l := newLedger()
	sendN(t, l, c.nodes["n1"], "a", 60, parts)
	time.Sleep(1500 * time.Millisecond) // n3 applied them (and its files materialized them)
	c.kill("n3")
	return c, l
}

// damagedReplica is the body of the damaged-replica tests: n3 is reopened (in a
// child) on its damaged directory. It must open or fail with a clear
// error, never panic or hang; the two others keep taking sends and hold
// every ack; reads through n3 see every ack as acked. Then n3's replicas
// are made needed for the quorum (n1, then n2, closed in turn): where they
// opened, every acked message must still be readable, unchanged, at its
// acked offset.
func damagedReplica(t *testing.T, parts int, damage func(c *testCluster)) {
	c, l := damagedSetup(t, parts)
	damage(c)
	ch := startNodeChild(t, c, "n3", parts)
	line := ch.expect(30*time.Second, "OPENED", "OPENERR")
	if line != "OPENED" {
		t.Logf("the damaged node refused to open (a clear error is allowed): %s", line)
	}
	// The two others serve on.
	sendN(t, l, c.nodes["n1"], "b", 20, parts)
	if verify(t, "through n1 with n3 damaged", c.nodes["n1"], parts, l) > 0 {
		t.FailNow()
	}
	if line != "OPENED" {
		return
	}
	time.Sleep(time.Second) // n3 catches up with the b messages
	ch.send("topics")
	shows := ch.expect(10*time.Second, "T ")
	t.Logf("n3 shows %s partitions of %s; stderr of n3:\n%.1500s", strings.TrimPrefix(shows, "T "), r3, ch.stderr.String())
	if shows != fmt.Sprintf("T %d", parts) {
		t.Errorf("n3 shows %s partitions of %d: the others serve those whose replica here did not open", shows, parts)
	}
	if strings.Contains(ch.stderr.String(), "cannot open") {
		// A replica did not open: a clear error (logged); the quorum of
		// its partition cannot need it.
		ch.close()
		return
	}
	checkChildReads(t, l, ch.read())
	// n3's replicas are needed for the quorum: the partitions whose
	// leadership moves to n3 serve from its (damaged) files.
	needN3(t, c, parts, func(what string, m *mq.MQ) {
		verify(t, "through "+what, m, parts, l)
		sendN(t, l, m, fmt.Sprintf("c%d", len(l.ids())), 8, parts)
	})
	ch.close()
}

// needN3 makes n3's replicas needed for the quorum: n1 closed, then n1
// reopened and n2 closed; each time check runs with the node left beside
// n3 (what: "<id> with <other> closed (leaders ...)"). Then n1 is closed
// too, so that n3 alone stands for election (it is first to, and leads
// once n1 and n2 are back), and check runs again with all three up.
func needN3(t *testing.T, c *testCluster, parts int, check func(what string, via *mq.MQ)) {
	t.Helper()
	for _, down := range []string{"n1", "n2"} {
		via := "n2"
		if down == "n2" {
			via = "n1"
			waitReadable(t, c.start("n1"), parts)
			time.Sleep(time.Second) // n1 catches up
		}
		c.kill(down)
		leaders := leadersSeenBy(t, c.nodes[via], parts, down)
		what := fmt.Sprintf("%s with %s closed (leaders %v)", via, down, leaders)
		t.Log(what)
		check(what, c.nodes[via])
		if t.Failed() {
			return
		}
	}
	c.kill("n1")
	time.Sleep(time.Second) // n3's replicas stand for election, in vain
	c.start("n1")
	c.start("n2")
	leaders := leadersSeenBy(t, c.nodes["n1"], parts)
	what := fmt.Sprintf("n1 with all up after n3 stood alone (leaders %v)", leaders)
	t.Log(what)
	check(what, c.nodes["n1"])
}

// committedAll reports whether group has committed everything in each of
// topic's parts partitions (no lag left).
func committedAll(m *mq.MQ, topic, group string, parts int) bool {
	lags, err := m.Lag(context.Background(), topic, group)
	if err != nil || len(lags) != parts {
		return false
	}
	for _, l := range lags {
		if !l.Known || l.Lag != 0 {
			return false
		}
	}
	return true
}

// resend sends msg until it is acked: again after ErrUnknownOutcome (a new
// group's first elections may still settle; the producer's contract is to
// send the same message again, which stores it once). Any other error
// fails t.
func resend(ctx context.Context, t testing.TB, p *mq.Producer, msg *mq.Message) mq.SendResult {
	t.Helper()
	for {
		res, err := p.SendMessage(ctx, msg)
		if err == nil {
			return res[0]
		}
		if !errors.Is(err, mq.ErrUnknownOutcome) {
			t.Fatalf("send %s: %v", msg.ID, err)
		}
	}
}
