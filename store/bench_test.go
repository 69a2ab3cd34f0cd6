package store

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPartition_Append measures durable appends the way mqbench's send
// case makes them: 64 senders, each appending one 1 KiB message with an ID
// and waiting for its fsync, spread over P partition files. Besides ns/op it
// reports msgs/gen, the depth of the group commit, and gens/commit, the
// depth of the materializer's bbolt transactions. WAL=1 shares one node WAL
// among the partitions, as mq.Open does.
func BenchmarkPartition_Append(b *testing.B) {
	const senders = 64
	for _, withWAL := range []bool{false, true} {
		for _, parts := range []int{1, 8} {
			b.Run(fmt.Sprintf("WAL=%v/P=%d", withWAL, parts), func(b *testing.B) {
				benchAppend(b, withWAL, parts, senders)
			})
		}
	}
}

func benchAppend(b *testing.B, withWAL bool, parts, senders int) {
	ps := make([]*Partition, parts)
	var wal *WAL
	if withWAL {
		var err error
		if wal, err = OpenWAL(filepath.Join(b.TempDir(), "wal"), WALOptions{}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { wal.Close() }) // after the partitions' Close
	}
	for i := range ps {
		p, err := Open(filepath.Join(b.TempDir(), strconv.Itoa(i)+".db"), Options{WAL: wal, Stream: strconv.Itoa(i)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := p.Close(); err != nil {
				b.Error(err)
			}
		})
		ps[i] = p
	}
	body := make([]byte, 1024)
	keys := make([]string, senders)
	for w := range keys {
		keys[w] = "key-" + strconv.Itoa(w)
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for w := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := &Command{Op: OpAppend, Msgs: make([]Message, 1)}
			for n := next.Add(1); n <= int64(b.N); n = next.Add(1) {
				// Time-ordered IDs, as the producer's UUIDv7s are.
				id := fmt.Sprintf("%020d", n)
				cmd.Msgs[0] = Message{ID: id, Key: keys[w], Body: body, FreshID: true}
				cmd.Now = time.Now().UnixNano()
				if _, err := ps[int(n)%parts].Apply(context.Background(), cmd); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	var commits, batches uint64
	for _, p := range ps {
		p.mu.Lock()
		commits += p.commits
		batches += p.batches
		p.mu.Unlock()
	}
	if batches > 0 {
		b.ReportMetric(float64(b.N)/float64(batches), "msgs/gen")
		b.ReportMetric(float64(batches)/float64(commits), "gens/commit")
	}
}
