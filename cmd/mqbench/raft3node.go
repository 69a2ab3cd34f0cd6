package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq"
)

func init() {
	register("raft3", "three cluster nodes in this process, a Raft3 topic of P partitions: C producers spread over the nodes send keyed messages", runRaft3Node)
}

// raft3Nodes are the nodes of the raft3 case, one replica of every
// partition each.
var raft3Nodes = []string{"r1", "r2", "r3"}

// runRaft3Node measures SendMessage to a Raft3 topic through the public
// API: three cluster nodes on 127.0.0.1 in this process, worker w's
// producer on node w%3. A send reaches its partition's leader through the
// node's own replica when it leads there, by RPC to the leader's node
// otherwise (two thirds of the sends): the whole path a user's send takes.
func runRaft3Node(ctx context.Context, b *bench) (res result, err error) {
	var nodes []*mq.MQ
	defer func() {
		for i := len(nodes) - 1; i >= 0; i-- {
			if cerr := nodes[i].Close(); err == nil {
				err = cerr
			}
		}
	}()
	var seeds []string
	for _, id := range raft3Nodes {
		m, err := mq.Open(filepath.Join(b.dir, id), mq.WithCluster(mq.ClusterConfig{
			NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Secret: remoteSecret,
			// As on a LAN under load (research §8.3): the machine runs
			// three nodes and their fsyncs on two cores.
			ElectionTimeout: time.Second,
		}))
		if err != nil {
			return result{}, err
		}
		nodes = append(nodes, m)
		seeds = append(seeds, m.ClusterStatus().Addr)
	}
	if err := waitUntil(ctx, 20*time.Second, "three nodes up", func() bool {
		up := 0
		for _, nd := range nodes[0].ClusterStatus().Nodes {
			if nd.Up {
				up++
			}
		}
		return up == len(raft3Nodes)
	}); err != nil {
		return result{}, err
	}
	if err := nodes[0].CreateMQ(ctx, "bench", b.partitions, mq.Options{Type: mq.Raft3}); err != nil {
		return result{}, err
	}
	if err := waitUntil(ctx, 20*time.Second, "a leader in every group", func() bool {
		led := 0
		for _, m := range nodes {
			if m.Topics()["bench"] != b.partitions {
				return false
			}
			led += len(m.ClusterStatus().Leading)
		}
		return led == b.partitions
	}); err != nil {
		return result{}, err
	}
	producers := make([]*mq.Producer, b.conc)
	for w := range producers {
		if producers[w], err = nodes[w%len(nodes)].NewProducer("bench"); err != nil {
			return result{}, err
		}
	}
	var retried atomic.Int64
	elapsed, err := b.closedLoop(ctx, func(ctx context.Context, w int, seq int64) error {
		msg := &mq.Message{Key: benchKeys[benchKey(w, seq)], Body: b.body}
		for {
			_, err := producers[w].SendMessage(ctx, msg)
			if err == nil || ctx.Err() != nil || !isUnknownOutcome(err) {
				return err
			}
			retried.Add(1) // the same message again: its ID finds a stored copy
		}
	})
	note := ""
	if n := retried.Load(); n > 0 {
		note = fmt.Sprintf("%d sends resent after a leader change", n)
	}
	return result{elapsed: elapsed, note: note}, err
}

func isUnknownOutcome(err error) bool { return errors.Is(err, mq.ErrUnknownOutcome) }
