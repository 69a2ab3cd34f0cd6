package main

import (
	"context"
	"strconv"

	"github.com/zeze-go/mq"
)

func init() {
	register("send", "C producers send keyed durable messages to a topic of P partitions", runSend)
}

// benchKeys are the ordering keys senders rotate through: enough of them to
// spread evenly over the partitions.
var benchKeys = func() []string {
	k := make([]string, 1024)
	for i := range k {
		k[i] = "key-" + strconv.Itoa(i)
	}
	return k
}()

// benchKey picks worker w's key for its seq-th message: each worker walks the
// keys from its own starting point.
func benchKey(w int, seq int64) int {
	return (w*31 + int(seq%int64(len(benchKeys)))) % len(benchKeys)
}

// runSend measures SendMessage: -c producers, each sending one message at a
// time and waiting for its acknowledgement, which follows the fsync.
func runSend(ctx context.Context, b *bench) (result, error) {
	m, err := b.openMQ(ctx)
	if err != nil {
		return result{}, err
	}
	defer m.Close()
	producers := make([]*mq.Producer, b.conc)
	for i := range producers {
		if producers[i], err = m.NewProducer("bench"); err != nil {
			return result{}, err
		}
	}
	elapsed, err := b.closedLoop(ctx, func(ctx context.Context, w int, seq int64) error {
		msg := &mq.Message{Key: benchKeys[benchKey(w, seq)], Body: b.body}
		_, err := producers[w].SendMessage(ctx, msg)
		return err
	})
	return result{elapsed: elapsed}, err
}
