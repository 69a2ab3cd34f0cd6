package mq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/testlog"
)

// load is the root tests' one load harness: producers sending to "d"
// through the nodes of a cluster while nodes are killed, restarted or cut
// off, each message resent with the same ID (through the node's next
// incarnation if it was killed) until acked. run starts a producer of
// single messages, runBatches one of batches spanning several partitions.
type load struct {
	mu    sync.Mutex
	parts int
	nodes map[string]*mq.MQ // the open incarnation of each node, nil while down
	acked []loadAck
	errs  []string // unexpected send errors
	stop  chan struct{}
	wg    sync.WaitGroup
}

// loadAck is one acked message: where the producer was told it is.
type loadAck struct {
	id     string
	part   int
	offset int64
	dup    bool
}

// newLoad returns a load of "d" with parts partitions through c's open
// nodes; it starts no producer.
func newLoad(c *testCluster, parts int) *load {
	l := &load{parts: parts, nodes: map[string]*mq.MQ{}, stop: make(chan struct{})}
	for id, m := range c.nodes {
		l.nodes[id] = m
	}
	return l
}

// set makes m the incarnation of node id the producers send through (nil:
// the node is down).
func (l *load) set(id string, m *mq.MQ) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nodes[id] = m
}

func (l *load) node(id string) *mq.MQ {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nodes[id]
}

// count returns how many messages were acked.
func (l *load) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// countIn returns how many acks went to partition part.
func (l *load) countIn(part int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.acked {
		if a.part == part {
			n++
		}
	}
	return n
}

// run starts producer id through node id: its message k is id-k, sent to
// partition k%parts once k-1 was acked.
func (l *load) run(id string) {
	l.start(id, func(k int) []*mq.Message {
		return []*mq.Message{(&mq.Message{ID: fmt.Sprintf("%s-%d", id, k), Body: []byte(id)}).ToPartition(k % l.parts)}
	})
}

// runBatches starts producer pre through node id, sending batches of one
// message to each partition of want (so that the partitions of a chunk are
// applied concurrently): message k of partition p is pre-<k*total+p>, with
// total the topic's final partition count, so n%total is its partition.
func (l *load) runBatches(id, pre string, total int, want []int) {
	l.start(id, func(k int) []*mq.Message {
		var batch []*mq.Message
		for _, part := range want {
			mid := fmt.Sprintf("%s-%d", pre, k*total+part)
			batch = append(batch, (&mq.Message{ID: mid, Body: []byte("body:" + mid)}).ToPartition(part))
		}
		return batch
	})
}

func (l *load) start(id string, batch func(k int) []*mq.Message) {
	l.wg.Go(func() {
		produce(l.stop, func() *mq.MQ { return l.node(id) }, batch, func(batch []*mq.Message, res []mq.SendResult) {
			l.mu.Lock()
			for i, r := range res {
				l.acked = append(l.acked, loadAck{id: batch[i].ID, part: r.Partition, offset: r.Offset, dup: r.Duplicate})
			}
			l.mu.Unlock()
		}, func(batch []*mq.Message, err error) {
			l.mu.Lock()
			if len(l.errs) < 10 {
				l.errs = append(l.errs, fmt.Sprintf("send %s.. via %s: %v", batch[0].ID, id, err))
			}
			l.mu.Unlock()
		})
	})
}

// stopAll stops the producers (once) and returns what was acked and the
// unexpected send errors.
func (l *load) stopAll() ([]loadAck, []string) {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.acked), slices.Clone(l.errs)
}

// finish stops the producers and returns the acked IDs and the unexpected
// send errors.
func (l *load) finish() (acked, errs []string) {
	acks, errs := l.stopAll()
	return ackIDs(acks), errs
}

// ended stops the producers and returns what was acked, failing t for
// each unexpected send error.
func (l *load) ended(t *testing.T) []loadAck {
	t.Helper()
	acked, errs := l.stopAll()
	for _, e := range errs {
		t.Errorf("unexpected: %s", e)
	}
	return acked
}

// endedIDs is ended's acked IDs.
func (l *load) endedIDs(t *testing.T) []string {
	t.Helper()
	return ackIDs(l.ended(t))
}

// finishChecked stops the producers and checks the acked IDs against what
// m reads (dwCheck), failing t for any unexpected send error; it returns
// the acked IDs.
func (l *load) finishChecked(t *testing.T, m *mq.MQ) []string {
	t.Helper()
	acked := l.endedIDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dwCheck(t, dwReadOrder(ctx, t, m, l.parts), acked, l.parts)
	return acked
}

// endedChecked is ended, then dwCheckAcks (each ack's partition, offset and
// body too) of what m reads of parts partitions.
func (l *load) endedChecked(t *testing.T, m *mq.MQ, parts int) []loadAck {
	t.Helper()
	acked := l.ended(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dwCheckAcks(t, dwReadMessages(ctx, t, m, parts), acked, parts)
	return acked
}

// ackIDs returns the IDs of acks.
func ackIDs(acks []loadAck) []string {
	ids := make([]string, 0, len(acks))
	for _, a := range acks {
		ids = append(ids, a.id)
	}
	return ids
}

// nodeLogs keeps each node's log lines across its restarts.
type nodeLogs struct {
	mu   sync.Mutex
	byID map[string]*testlog.Lines
}

func (l *nodeLogs) of(id string) *testlog.Lines {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID = map[string]*testlog.Lines{}
	}
	if l.byID[id] == nil {
		l.byID[id] = &testlog.Lines{}
	}
	return l.byID[id]
}

func (l *nodeLogs) opts(id string) []mq.Option {
	return []mq.Option{mq.WithLogger(slog.New(l.of(id)))}
}

// matching returns the lines of every node holding every part, prefixed
// with the node's id.
func (l *nodeLogs) matching(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, lines := range l.byID {
		for _, line := range lines.Matching(parts...) {
			out = append(out, id+": "+line)
		}
	}
	sort.Strings(out)
	return out
}

// dwHasReplicaDir reports whether node id ever opened a replica of d/part
// (its pair's directory).
func dwHasReplicaDir(c *testCluster, id string, part int) bool {
	_, err := os.Stat(filepath.Join(c.root, id, "dw", "d", fmt.Sprint(part)))
	return err == nil
}

// dwFollowerAtCreation is the node other than the leader that opened a
// replica of d/part when the topic was created (the third node has none).
func dwFollowerAtCreation(t *testing.T, c *testCluster, part int) (leader, follower string) {
	t.Helper()
	leader = c.leaderOf("d", part)
	for id := range c.nodes {
		if id != leader && dwHasReplicaDir(c, id, part) {
			if follower != "" {
				t.Fatalf("two nodes besides the leader %s hold a replica of d/%d: %s and %s", leader, part, follower, id)
			}
			follower = id
		}
	}
	if follower == "" {
		t.Fatalf("no follower of d/%d found", part)
	}
	return leader, follower
}

// dwSendWithin sends n messages tagged tag through m to partition i%parts of
// "d", each resent on ErrUnknownOutcome and ErrNoQuorum, all within d; it
// returns the acked IDs and the last error when d ran out (nil if all were
// acked).
func dwSendWithin(m *mq.MQ, parts, n int, tag string, d time.Duration) (acked []string, last error) {
	return dwSend(m, parts, -1, n, tag, d)
}

// dwSend is dwSendWithin to partition part only (-1: i%parts), message k's
// ID numbered k*parts+part (readAll checks the partition by it).
func dwSend(m *mq.MQ, parts, part, n int, tag string, d time.Duration) (acked []string, last error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	p, err := m.NewProducer("d")
	if err != nil {
		return nil, err
	}
	defer p.Close()
	for i := range n {
		to, num := i%parts, i
		if part >= 0 {
			to, num = part, i*parts+part
		}
		msg := (&mq.Message{ID: fmt.Sprintf("%s-%d", tag, num), Body: []byte(tag)}).ToPartition(to)
		for {
			sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := p.SendMessage(sctx, msg)
			scancel()
			if err == nil {
				break
			}
			last = err
			if !errors.Is(err, mq.ErrUnknownOutcome) && !errors.Is(err, mq.ErrNoQuorum) && !errors.Is(err, context.DeadlineExceeded) {
				return acked, err
			}
			if ctx.Err() != nil {
				return acked, last
			}
			time.Sleep(20 * time.Millisecond)
		}
		acked = append(acked, msg.ID)
	}
	return acked, nil
}

// dwCheckStored reads "d" through m and fails the test for every acked ID not
// stored exactly once (readAll checks the partitions).
func dwCheckStored(ctx context.Context, t *testing.T, m *mq.MQ, parts int, acked []string) map[string]int {
	t.Helper()
	seen := readAll(ctx, t, m, "d", parts)
	lost, twice := 0, 0
	for _, id := range acked {
		switch {
		case seen[id] == 0:
			lost++
			if lost <= 5 {
				t.Errorf("acked %s lost", id)
			}
		case seen[id] > 1:
			twice++
			if twice <= 5 {
				t.Errorf("acked %s stored %d times", id, seen[id])
			}
		}
	}
	if lost+twice > 0 {
		t.Errorf("%d of %d acked messages lost, %d stored more than once", lost, len(acked), twice)
	}
	return seen
}

// dwFollower returns the node other than leader that holds a replica of
// d/part now (mq.Served finds a replica), "" if none.
func dwFollower(c *testCluster, leader string, part int) string {
	for _, id := range othersThan(c, leader) {
		if mq.Served(c.nodes[id], "d", part) == nil {
			return id
		}
	}
	return ""
}

// dwPairOff returns a partition of "d" (parts partitions) whose leader
// and follower are both nodes other than the metadata leader, and them.
// The topic needs pairs of their own (PartitionsPerPair 1), spread over
// the nodes.
func dwPairOff(t *testing.T, c *testCluster, parts int) (part int, leader, follower string) {
	t.Helper()
	var meta string
	waitFor(t, 10*time.Second, "a metadata leader", func() bool {
		meta = c.nodes["n1"].ClusterStatus().Leader
		return meta != ""
	})
	for i := range parts {
		leader := c.leaderOf("d", i)
		follower := dwFollower(c, leader, i)
		if leader != meta && follower != meta && follower != "" {
			return i, leader, follower
		}
	}
	t.Fatalf("no partition of d off the metadata leader %s", meta)
	return
}

// produce sends batch(k), for k = 0, 1, ..., through the node node
// returns (a producer of "d" made anew when it changes; none while it is
// nil) until stop closes, each batch resent until acked: ErrUnknownOutcome,
// ErrNoQuorum, ErrClosed and a send's 2 s timeout are waited out, acked
// gets each acked batch with its results, fail the batches refused
// otherwise (sent again after a wait).
func produce(stop <-chan struct{}, node func() *mq.MQ, batch func(k int) []*mq.Message,
	acked func([]*mq.Message, []mq.SendResult), fail func([]*mq.Message, error)) {
	var p *mq.Producer
	var via *mq.MQ
	defer func() {
		if p != nil {
			p.Close()
		}
	}()
	for k := 0; ; {
		select {
		case <-stop:
			return
		default:
		}
		m := node()
		if m == nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if via != m {
			if p != nil {
				p.Close()
			}
			var err error
			if p, err = m.NewProducer("d"); err != nil {
				p, via = nil, nil
				time.Sleep(50 * time.Millisecond)
				continue
			}
			via = m
		}
		b := batch(k)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		res, err := p.SendMessage(ctx, b...)
		cancel()
		switch {
		case err == nil:
			acked(b, res)
			k++
		case errors.Is(err, mq.ErrUnknownOutcome), errors.Is(err, mq.ErrNoQuorum), errors.Is(err, mq.ErrClosed),
			errors.Is(err, context.DeadlineExceeded):
			time.Sleep(20 * time.Millisecond)
		default:
			fail(b, err)
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// dwReadOrder returns the IDs stored in each partition of "d", in offset
// order, read through m.
func dwReadOrder(ctx context.Context, t *testing.T, m *mq.MQ, parts int) [][]string {
	t.Helper()
	out := make([][]string, parts)
	for i := range parts {
		for off := int64(0); ; off++ {
			msg, err := m.ReadMessage(ctx, "d", i, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				t.Fatalf("read d %d/%d: %v", i, off, err)
			}
			out[i] = append(out[i], msg.ID)
		}
	}
	return out
}

// dwCheck fails the test for an acked ID lost, any ID stored twice or in
// another partition than its number sends it to, and the acked messages of
// one producer out of order in a partition.
func dwCheck(t *testing.T, stored [][]string, acked []string, parts int) {
	t.Helper()
	where := map[string]int{}
	bad := 0
	report := func(format string, args ...any) {
		if bad++; bad <= 10 {
			t.Errorf(format, args...)
		}
	}
	for i, ids := range stored {
		last := map[string]int{} // producer → last number seen in partition i
		for _, id := range ids {
			if prev, ok := where[id]; ok {
				report("%s stored twice (partitions %d and %d)", id, prev, i)
			}
			where[id] = i
			k := strings.LastIndexByte(id, '-')
			n, err := strconv.Atoi(id[k+1:])
			if k <= 0 || err != nil {
				continue // not the load's
			}
			if n%parts != i {
				report("%s in partition %d, sent to %d", id, i, n%parts)
			}
			if prev, ok := last[id[:k]]; ok && n < prev {
				report("%s after %s-%d in partition %d: reordered", id, id[:k], prev, i)
			}
			last[id[:k]] = n
		}
	}
	lost := 0
	for _, id := range acked {
		if _, ok := where[id]; !ok {
			if lost++; lost <= 10 {
				t.Errorf("acked %s lost", id)
			}
		}
	}
	if lost+bad > 0 {
		t.Errorf("%d of %d acked messages lost; %d other faults", lost, len(acked), bad)
	}
}

// dwReadMessages returns every message of each partition of "d", in offset order,
// read through m.
func dwReadMessages(ctx context.Context, t *testing.T, m *mq.MQ, parts int) [][]*mq.Message {
	t.Helper()
	out := make([][]*mq.Message, parts)
	for i := range parts {
		for off := int64(0); ; off++ {
			msg, err := m.ReadMessage(ctx, "d", i, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				t.Fatalf("read d %d/%d: %v", i, off, err)
			}
			out[i] = append(out[i], msg)
		}
	}
	return out
}

// dwCheckAcks is dwCheck (total: the modulus of the producers' numbering)
// plus: each message's body is its own, and each ack's partition and offset
// (a fresh store, not a duplicate) hold that message.
func dwCheckAcks(t *testing.T, stored [][]*mq.Message, acked []loadAck, total int) {
	t.Helper()
	ids := make([][]string, len(stored))
	bad := 0
	report := func(format string, args ...any) {
		if bad++; bad <= 10 {
			t.Errorf(format, args...)
		}
	}
	for i, msgs := range stored {
		for off, m := range msgs {
			ids[i] = append(ids[i], m.ID)
			if string(m.Body) != "body:"+m.ID && strings.HasPrefix(string(m.Body), "body:") {
				report("d/%d offset %d: %s carries the body %q", i, off, m.ID, m.Body)
			}
		}
	}
	ackIDs := make([]string, 0, len(acked))
	for _, a := range acked {
		ackIDs = append(ackIDs, a.id)
		k := strings.LastIndexByte(a.id, '-')
		n, _ := strconv.Atoi(a.id[k+1:])
		if a.part != n%total {
			report("%s acked in partition %d, sent to %d", a.id, a.part, n%total)
			continue
		}
		if a.dup || a.offset < 0 {
			continue
		}
		if a.offset >= int64(len(ids[a.part])) {
			report("%s acked at d/%d offset %d; the partition holds %d", a.id, a.part, a.offset, len(ids[a.part]))
		} else if got := ids[a.part][a.offset]; got != a.id {
			report("%s acked at d/%d offset %d, which holds %s", a.id, a.part, a.offset, got)
		}
	}
	dwCheck(t, ids, ackIDs, total)
	if bad > 0 {
		t.Errorf("%d acks or bodies wrong", bad)
	}
}

// dwLeaders returns the node leading each partition of d.
func dwLeaders(c *testCluster, parts int) []string {
	out := make([]string, parts)
	for i := range parts {
		out[i] = c.leaderOf("d", i)
	}
	return out
}

// dwChunkOff returns the first partition of a chunk among firsts whose
// leader and follower are both nodes other than the metadata leader, them,
// and the metadata leader.
func dwChunkOff(t *testing.T, c *testCluster, firsts []int) (first int, leader, follower, meta string) {
	t.Helper()
	waitFor(t, 10*time.Second, "a metadata leader", func() bool {
		meta = c.nodes["n1"].ClusterStatus().Leader
		return meta != ""
	})
	for _, i := range firsts {
		leader = c.leaderOf("d", i)
		follower = dwFollower(c, leader, i)
		if leader != meta && follower != meta && follower != "" {
			return i, leader, follower, meta
		}
	}
	t.Fatalf("no chunk off the metadata leader %s", meta)
	return
}

// leaderOf returns the node whose replica leads partition part of topic.
func (c *testCluster) leaderOf(topic string, part int) string {
	c.t.Helper()
	var leader string
	waitFor(c.t, 20*time.Second, fmt.Sprintf("a leader of %s/%d", topic, part), func() bool {
		for id, m := range c.nodes {
			if slices.Contains(m.ClusterStatus().Leading, fmt.Sprintf("%s/%d", topic, part)) {
				leader = id
				return true
			}
		}
		return false
	})
	return leader
}

// sendAll sends n messages tagged tag through node from to partition
// i%parts of topic, each resent until acked (ErrUnknownOutcome and
// ErrNoQuorum are waited out), and returns their IDs.
func sendAll(ctx context.Context, t *testing.T, m *mq.MQ, topic string, parts, n int, tag string) []string {
	t.Helper()
	p, err := m.NewProducer(topic)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var ids []string
	for i := range n {
		msg := (&mq.Message{ID: fmt.Sprintf("%s-%d", tag, i), Body: []byte(tag)}).ToPartition(i % parts)
		for {
			_, err := p.SendMessage(ctx, msg)
			if err == nil {
				break
			}
			if !errors.Is(err, mq.ErrUnknownOutcome) && !errors.Is(err, mq.ErrNoQuorum) {
				t.Fatalf("send %s: %v", msg.ID, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		ids = append(ids, msg.ID)
	}
	return ids
}

// readAll returns how many times each ID is stored in topic, read through
// m; a message of sendAll's must be in the partition its ID's tag-<n> sent
// it to (n%parts).
func readAll(ctx context.Context, t *testing.T, m *mq.MQ, topic string, parts int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := range parts {
		for off := int64(0); ; off++ {
			msg, err := m.ReadMessage(ctx, topic, i, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				t.Fatalf("read %s %d/%d: %v", topic, i, off, err)
			}
			seen[msg.ID]++
			k := strings.LastIndexByte(msg.ID, '-')
			if n, err := strconv.Atoi(msg.ID[k+1:]); err == nil && k > 0 && n%parts != i {
				t.Errorf("%s in partition %d, sent to %d", msg.ID, i, n%parts)
			}
		}
	}
	return seen
}

// record returns the metadata record of partition part of topic as some
// open node sees it.
func (c *testCluster) record(topic string, part int) (leader string, replicas, inSync []string) {
	for _, m := range c.nodes {
		leader, replicas, inSync, _ = mq.PairRecord(m, topic, part)
		return leader, replicas, inSync
	}
	return "", nil, nil
}

// holdsReplica reports whether node id holds a replica of the partition.
func (c *testCluster) holdsReplica(id, topic string, part int) bool {
	_, replicas, _ := c.record(topic, part)
	return slices.Contains(replicas, id)
}

// inSync reports whether node id is recorded in sync for the partition.
func (c *testCluster) inSync(topic string, part int, id string) bool {
	_, _, inSync := c.record(topic, part)
	return slices.Contains(inSync, id)
}

// createPair creates DoubleWrite topic "d" of parts partitions in one
// pair on a cluster of three nodes, waits until every node has it, and
// returns the pair's leader, its follower and the third node.
func (c *testCluster) createPair(ctx context.Context, parts int) (leader, follower, other string) {
	c.t.Helper()
	if err := c.nodes["n1"].CreateMQ(ctx, "d", parts, mq.Options{Type: mq.DoubleWrite}); err != nil {
		c.t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(c.t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()["d"] == parts })
	}
	leader = c.leaderOf("d", 0)
	for id := range c.nodes {
		switch {
		case id == leader:
		case c.holdsReplica(id, "d", 0):
			follower = id
		default:
			other = id
		}
	}
	return leader, follower, other
}
