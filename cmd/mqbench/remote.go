package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq"
)

func init() {
	register("remote", "send (at -c and at 1) and drain from a cluster node whose partitions all live on the other node, against the same on that node: ratios remote/local (about 5 x -duration)", runRemote)
}

const (
	remoteRounds      = 5       // send rounds, each mode one slot of -duration/5
	remoteDrainRounds = 3       // drain rounds, local then remote
	remoteDrainMax    = 100_000 // messages in the drained backlog at most
)

var remoteSecret = []byte("e4b7a1d8c2f5e9b3a6d0c7f1e4b8a2d5c9f3e6b0a7d1c4f8")

// remoteMode is one measurement of runRemote: a send at some concurrency
// or a drain, on node A, remote, or B, local.
type remoteMode struct {
	name   string
	remote bool
	conc   int

	msgs    int64
	elapsed time.Duration
	lat     []time.Duration
	cpu     time.Duration // of the process: both nodes
	rates   []float64     // one per round
}

func (md *remoteMode) result(size int) result {
	slices.Sort(md.lat)
	return result{msgs: md.msgs, bytes: md.msgs * int64(size), elapsed: md.elapsed, lat: md.lat, cpu: md.cpu}
}

// runRemote measures what a partition on another node costs. Two cluster
// nodes run in this process on 127.0.0.1: B starts the cluster alone and
// creates the topics, so every partition is placed on B; then A joins. The
// same work runs on A, where every call crosses the loopback link to B,
// and on B, where it stays local:
//
//	send c=N: -c workers, each SendMessage of one message after another
//	send c=1: one worker
//	drain:    a new consumer group delivering a backlog filled beforehand
//	          (timed from NewConsumer: the group's join is in it)
//
// The modes take turns in rounds, as in tx, so the machine's changes of
// load weigh on both nodes alike. Each measurement prints a line, whose CPU
// is the process's, both nodes'. The case's own line repeats the remote
// send at -c; its note gives the ratios remote/local of the rates, the
// median of the rounds' ratios, and of p50 and p99 over all rounds.
func runRemote(ctx context.Context, b *bench) (result, error) {
	nb, err := b.openNode("b")
	if err != nil {
		return result{}, err
	}
	defer nb.Close() // after A's: deferred first
	for _, topic := range []string{"bench", "drain"} {
		if err := nb.CreateMQ(ctx, topic, b.partitions, mq.Options{Type: mq.Single}); err != nil {
			return result{}, err
		}
	}
	na, err := b.openNode("a", nb.ClusterStatus().Addr)
	if err != nil {
		return result{}, err
	}
	defer na.Close()
	if err := waitUntil(ctx, 20*time.Second, "node a to know the topics", func() bool {
		t := na.Topics()
		return t["bench"] == b.partitions && t["drain"] == b.partitions
	}); err != nil {
		return result{}, err
	}
	nodes := map[bool]*mq.MQ{false: nb, true: na}

	producers := map[bool][]*mq.Producer{}
	for remote, m := range nodes {
		for range b.conc {
			p, err := m.NewProducer("bench")
			if err != nil {
				return result{}, err
			}
			producers[remote] = append(producers[remote], p)
		}
	}
	sends := []*remoteMode{
		{name: fmt.Sprintf("send c=%d local", b.conc), conc: b.conc},
		{name: fmt.Sprintf("send c=%d remote", b.conc), conc: b.conc, remote: true},
		{name: "send c=1 local", conc: 1},
		{name: "send c=1 remote", conc: 1, remote: true},
	}
	slot := max(b.duration/remoteRounds, 200*time.Millisecond)
	for range remoteRounds {
		for _, md := range sends {
			ps := producers[md.remote]
			cpu0 := cpuTime()
			n, elapsed, lat, err := b.loopFor(ctx, md.conc, slot, func(ctx context.Context, w int, seq int64) error {
				_, err := ps[w].SendMessage(ctx, &mq.Message{Key: benchKeys[benchKey(w, seq)], Body: b.body})
				return err
			})
			if err != nil {
				return result{}, fmt.Errorf("%s: %w", md.name, err)
			}
			if ctx.Err() != nil {
				return result{}, ctx.Err()
			}
			md.cpu += cpuTime() - cpu0
			md.msgs += n
			md.elapsed += elapsed
			md.lat = append(md.lat, lat...)
			md.rates = append(md.rates, float64(n)/elapsed.Seconds())
		}
	}

	backlog, err := b.fillTopic(ctx, nb, "drain", b.duration/2)
	if err != nil {
		return result{}, fmt.Errorf("fill: %w", err)
	}
	drains := []*remoteMode{{name: "drain local"}, {name: "drain remote", remote: true}}
	for round := range remoteDrainRounds {
		for _, md := range drains {
			cpu0 := cpuTime()
			elapsed, err := b.drain(ctx, nodes[md.remote], "drain", fmt.Sprintf("%s-%d", strings.Fields(md.name)[1], round), backlog)
			if err != nil {
				return result{}, fmt.Errorf("%s: %w", md.name, err)
			}
			md.cpu += cpuTime() - cpu0
			md.msgs += backlog
			md.elapsed += elapsed
			md.rates = append(md.rates, float64(backlog)/elapsed.Seconds())
		}
	}

	for _, md := range append(slices.Clone(sends), drains...) {
		fmt.Println(md.result(b.size).line(fmt.Sprintf("  %-18s", md.name)))
	}
	var ratios []string
	for _, pair := range [][2]*remoteMode{{sends[0], sends[1]}, {sends[2], sends[3]}, {drains[0], drains[1]}} {
		local, remote := pair[0], pair[1]
		s := fmt.Sprintf("%s %.2f", strings.TrimSuffix(local.name, " local"), medianRatio(remote.rates, local.rates))
		if len(local.lat) > 0 {
			s += fmt.Sprintf(" (p50 %.2f, p99 %.2f)",
				durRatio(percentile(remote.lat, 0.50), percentile(local.lat, 0.50)),
				durRatio(percentile(remote.lat, 0.99), percentile(local.lat, 0.99)))
		}
		ratios = append(ratios, s)
	}
	res := sends[1].result(b.size)
	res.note = fmt.Sprintf("= the line %q; ratio remote/local: %s; cpu: of the whole case", sends[1].name, strings.Join(ratios, ", "))
	return res, nil
}

// openNode opens cluster node id in the case's directory on 127.0.0.1, a
// port of its own, joining through seeds; with none it starts the cluster.
func (b *bench) openNode(id string, seeds ...string) (*mq.MQ, error) {
	return b.openNodeWith(id, 300*time.Millisecond, seeds...)
}

// openNodeWith is openNode with the nodes' raft election timeout. The
// node runs without TLS (InsecurePlaintext) unless b.tls is set: then on
// mutual TLS with a certificate from the case's CA.
func (b *bench) openNodeWith(id string, election time.Duration, seeds ...string) (*mq.MQ, error) {
	cc := mq.ClusterConfig{
		NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: remoteSecret,
		ElectionTimeout: election, InsecurePlaintext: !b.tls,
	}
	if b.tls {
		var err error
		if cc.ServerTLS, cc.ClientTLS, err = b.nodeTLS(id); err != nil {
			return nil, err
		}
	}
	return mq.Open(filepath.Join(b.dir, id), mq.WithCluster(cc))
}

// loopFor runs op on conc workers for d with closedLoop and returns what this
// run alone measured: its operations, time and latencies.
func (b *bench) loopFor(ctx context.Context, conc int, d time.Duration, op func(ctx context.Context, worker int, seq int64) error) (int64, time.Duration, []time.Duration, error) {
	saved := b.conc
	b.conc = conc
	defer func() { b.conc = saved }()
	b.meter.mu.Lock()
	s0 := len(b.meter.series)
	b.meter.mu.Unlock()
	n0 := b.meter.count.Load()
	elapsed, err := b.closedLoopFor(ctx, d, op)
	n := b.meter.count.Load() - n0
	var lat []time.Duration
	b.meter.mu.Lock()
	for _, r := range b.meter.series[s0:] {
		lat = append(lat, r.lat...)
	}
	b.meter.mu.Unlock()
	return n, elapsed, lat, err
}

// fillTopic sends keyed messages to topic on m in batches of
// consumeFillBatch from -c senders, for d or until remoteDrainMax are
// stored, and returns how many were stored.
func (b *bench) fillTopic(ctx context.Context, m *mq.MQ, topic string, d time.Duration) (int64, error) {
	p, err := m.NewProducer(topic)
	if err != nil {
		return 0, err
	}
	var claimed atomic.Int64 // batches
	_, err = b.closedLoopFor(ctx, d, func(ctx context.Context, w int, _ int64) error {
		seq := claimed.Add(1) - 1
		if (seq+1)*consumeFillBatch > remoteDrainMax {
			<-ctx.Done() // full: wait for the others
			return nil
		}
		msgs := make([]*mq.Message, consumeFillBatch)
		for i := range msgs {
			msgs[i] = &mq.Message{Key: benchKeys[benchKey(w, seq*consumeFillBatch+int64(i))], Body: b.body}
		}
		if _, err := p.SendMessage(context.WithoutCancel(ctx), msgs...); err != nil {
			return err
		}
		return nil
	})
	return min(claimed.Load(), remoteDrainMax/consumeFillBatch) * consumeFillBatch, err
}

// drain subscribes a new group on m to topic and returns the time until it
// was delivered n messages.
func (b *bench) drain(ctx context.Context, m *mq.MQ, topic, group string, n int64) (time.Duration, error) {
	var received atomic.Int64
	done := make(chan struct{})
	start := time.Now()
	c, err := m.NewConsumer(topic, group, mq.ListenerFunc(func(context.Context, string, *mq.Message) error {
		b.meter.count.Add(1) // drives the progress line
		if received.Add(1) == n {
			close(done)
		}
		return nil
	}))
	if err != nil {
		return 0, err
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	elapsed := time.Since(start)
	if err := c.Close(); err != nil {
		return 0, err
	}
	return elapsed, ctx.Err()
}

// waitUntil polls cond every 10ms until it is true, for at most d.
func waitUntil(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: not within %v", what, d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// medianRatio is the median of num[i]/den[i].
func medianRatio(num, den []float64) float64 {
	r := make([]float64, len(num))
	for i := range num {
		r[i] = num[i] / den[i]
	}
	slices.Sort(r)
	return r[len(r)/2]
}

func durRatio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
