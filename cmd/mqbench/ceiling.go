package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sync"

	bolt "go.etcd.io/bbolt"
)

func init() {
	register("ceiling", "naive group commit on raw bbolt in one file, same C and size: the yardstick for send", runCeiling)
	register("ceiling-p", "the same naive loop over P raw bbolt files, keyed like send", runCeilingP)
}

// runCeiling measures the simplest correct group commit: one bbolt file, one
// writer goroutine that takes every append waiting, puts them in one
// transaction, commits it with fsync and then acknowledges them. No fixed
// delay, no pipelining. It opens bbolt with the same options as the store, so
// the ratio send/ceiling measures the store's design, not bbolt tuning.
func runCeiling(ctx context.Context, b *bench) (result, error) {
	return runNaive(ctx, b, 1)
}

// runCeilingP runs the naive loop on P files at once: what one file per
// partition gives before any of the store's own work of encoding, CRC,
// dedup index and state, so send can be compared with its own architecture
// too.
func runCeilingP(ctx context.Context, b *bench) (result, error) {
	return runNaive(ctx, b, b.partitions)
}

// ceilingReq is one append waiting for a naive writer.
type ceilingReq struct {
	body []byte
	done chan error
}

func runNaive(ctx context.Context, b *bench, files int) (result, error) {
	var (
		queues  []chan *ceilingReq
		writers sync.WaitGroup
	)
	defer func() {
		for _, q := range queues {
			close(q)
		}
		writers.Wait()
	}()
	for i := range files {
		db, err := bolt.Open(filepath.Join(b.dir, fmt.Sprintf("naive-%d.db", i)), 0o600,
			&bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
		if err != nil {
			return result{}, err
		}
		if err := db.Update(func(tx *bolt.Tx) error {
			_, err := tx.CreateBucketIfNotExists([]byte("log"))
			return err
		}); err != nil {
			db.Close()
			return result{}, err
		}
		q := make(chan *ceilingReq, b.conc)
		queues = append(queues, q)
		writers.Add(1)
		go func() {
			defer writers.Done()
			defer db.Close()
			naiveWriter(db, q)
		}()
	}
	elapsed, err := b.closedLoop(ctx, func(ctx context.Context, w int, seq int64) error {
		r := &ceilingReq{body: b.body, done: make(chan error, 1)}
		queues[benchKey(w, seq)%len(queues)] <- r
		return <-r.done
	})
	return result{elapsed: elapsed}, err
}

// naiveWriter is the naive group commit loop: block for one request, take
// all that are waiting, write them in one transaction, commit with its
// fsync, ack.
// It returns when reqs is closed.
func naiveWriter(db *bolt.DB, reqs <-chan *ceilingReq) {
	var next uint64
	batch := make([]*ceilingReq, 0, 256)
	for r := range reqs {
		batch = append(batch[:0], r)
	drain:
		for {
			select {
			case r, ok := <-reqs:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		err := db.Update(func(tx *bolt.Tx) error {
			bk := tx.Bucket([]byte("log"))
			for _, r := range batch {
				k := make([]byte, 8) // bbolt keeps keys until commit
				binary.BigEndian.PutUint64(k, next)
				next++
				if err := bk.Put(k, r.body); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			err = fmt.Errorf("naive commit: %w", err)
		}
		for _, r := range batch {
			r.done <- err
		}
	}
}
