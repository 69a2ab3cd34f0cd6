package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
)

func init() {
	register("tx", "committed host transactions/s with one message each: plain send after the commit, CommitMessage, PrepareMessage (bbolt host; 3 x -duration)", runTx)
}

var txAccounts = []byte("accounts")

// runTx measures transactional sends against their baseline in one run, on
// one node and one host bbolt DB: -c workers run host transactions that
// each write one business row and send one message,
//
//	plain:   commit the host transaction, then SendMessage
//	commit:  CommitMessage inside the transaction (outbox, published at commit)
//	prepare: PrepareMessage inside the transaction (half message, committed at commit)
//
// for -duration each, in turns of -duration/5. The line reports the commit
// mode; the note gives every rate and the cost ratios against plain, where
// the target for commit is at most 1.5.
func runTx(ctx context.Context, b *bench) (result, error) {
	db, err := bolt.Open(filepath.Join(b.dir, "host.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return result{}, err
	}
	defer db.Close() // after the node: deferred first
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(txAccounts)
		return err
	}); err != nil {
		return result{}, err
	}
	host, err := localtx.NewBolt(db, localtx.BoltOptions{})
	if err != nil {
		return result{}, err
	}
	m, err := b.openMQ(ctx, mq.WithLocalTx(host))
	if err != nil {
		return result{}, err
	}
	defer m.Close()
	p, err := m.NewProducer("bench")
	if err != nil {
		return result{}, err
	}
	business := func(ctx context.Context, w int, seq int64) error {
		return host.Tx(ctx).Bucket(txAccounts).Put([]byte("acct-"+strconv.Itoa(w)), strconv.AppendInt(nil, seq, 10))
	}
	msg := func(w int, seq int64) *mq.Message {
		return &mq.Message{Key: benchKeys[benchKey(w, seq)], Body: b.body}
	}
	modes := []struct {
		name string
		op   func(ctx context.Context, w int, seq int64) error
	}{
		{"plain", func(ctx context.Context, w int, seq int64) error {
			if err := host.Run(ctx, func(ctx context.Context) error { return business(ctx, w, seq) }); err != nil {
				return err
			}
			_, err := p.SendMessage(ctx, msg(w, seq))
			return err
		}},
		{"commit", func(ctx context.Context, w int, seq int64) error {
			return host.Run(ctx, func(ctx context.Context) error {
				if err := business(ctx, w, seq); err != nil {
					return err
				}
				return p.CommitMessage(ctx, msg(w, seq))
			})
		}},
		{"prepare", func(ctx context.Context, w int, seq int64) error {
			return host.Run(ctx, func(ctx context.Context) error {
				if err := business(ctx, w, seq); err != nil {
					return err
				}
				return p.PrepareMessage(ctx, msg(w, seq))
			})
		}},
	}
	// The modes take turns in short rounds, so a change in the machine's
	// load, or the files' growth, weighs on each alike; every round gives
	// one ratio, and the median is reported.
	const rounds = 5
	slot := max(b.duration/rounds, 200*time.Millisecond)
	counts := map[string]int64{}
	spent := map[string]time.Duration{}
	var commitRatios, prepareRatios []float64
	var res result
	for range rounds {
		rate := map[string]float64{}
		for _, mode := range modes {
			n0 := b.meter.count.Load()
			b.meter.mu.Lock()
			s0 := len(b.meter.series)
			b.meter.mu.Unlock()
			elapsed, err := b.closedLoopFor(ctx, slot, mode.op)
			if err != nil {
				return result{}, fmt.Errorf("%s: %w", mode.name, err)
			}
			if ctx.Err() != nil {
				return result{}, ctx.Err()
			}
			n := b.meter.count.Load() - n0
			counts[mode.name] += n
			spent[mode.name] += elapsed
			rate[mode.name] = float64(n) / elapsed.Seconds()
			if mode.name == "commit" {
				b.meter.mu.Lock()
				for _, r := range b.meter.series[s0:] {
					res.lat = append(res.lat, r.lat...)
				}
				b.meter.mu.Unlock()
			}
		}
		commitRatios = append(commitRatios, rate["plain"]/rate["commit"])
		prepareRatios = append(prepareRatios, rate["plain"]/rate["prepare"])
	}
	slices.Sort(res.lat)
	slices.Sort(commitRatios)
	slices.Sort(prepareRatios)
	res.msgs, res.elapsed = counts["commit"], spent["commit"]
	res.bytes = res.msgs * int64(b.size)
	rate := func(mode string) float64 { return float64(counts[mode]) / spent[mode].Seconds() }
	res.note = fmt.Sprintf("tx/s: plain %.0f, commit %.0f, prepare %.0f; cost vs plain send + host commit (median of %d rounds): commit %.2fx (target <= 1.5), prepare %.2fx",
		rate("plain"), rate("commit"), rate("prepare"), rounds, commitRatios[rounds/2], prepareRatios[rounds/2])
	return res, nil
}

// closedLoopFor is closedLoop for d instead of -duration.
func (b *bench) closedLoopFor(ctx context.Context, d time.Duration, op func(ctx context.Context, worker int, seq int64) error) (time.Duration, error) {
	saved := b.duration
	b.duration = d
	defer func() { b.duration = saved }()
	return b.closedLoop(ctx, op)
}
