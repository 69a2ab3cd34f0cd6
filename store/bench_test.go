package store

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkPartition_Append measures durable appends the way mqbench's send
// case makes them: 64 senders, each appending one 1 KiB message with an ID
// and waiting for its fsync, spread over P partition files. Besides ns/op it
// reports msgs/commit, the depth of the group commit.
func BenchmarkPartition_Append(b *testing.B) {
	const senders = 64
	for _, parts := range []int{1, 8} {
		b.Run("P="+strconv.Itoa(parts), func(b *testing.B) {
			ps := make([]*Partition, parts)
			for i := range ps {
				p, err := Open(filepath.Join(b.TempDir(), strconv.Itoa(i)+".db"), Options{})
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
						cmd.Msgs[0] = Message{ID: id, Key: keys[w], Body: body}
						cmd.Now = 0
						if err := ps[int(n)%parts].Apply(context.Background(), cmd); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			var commits, commands uint64
			for _, p := range ps {
				p.mu.Lock()
				commits += p.commits
				commands += p.commands
				p.mu.Unlock()
			}
			if commits > 0 {
				b.ReportMetric(float64(commands)/float64(commits), "msgs/commit")
			}
		})
	}
}
