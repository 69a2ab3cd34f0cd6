package localtx

import bolt "go.etcd.io/bbolt"

// SetBoltCommit makes b commit its transactions with commit, a test's
// stand-in for bbolt's Commit.
func SetBoltCommit(b *Bolt, commit func(*bolt.Tx) error) { b.commit = commit }

// Waiting counts the Runs of b queued for a batch that has not taken them
// yet.
func Waiting(b *Bolt) int {
	b.group.mu.Lock()
	defer b.group.mu.Unlock()
	n := 0
	for _, m := range b.group.queue {
		if m.state.Load() == memberWaiting {
			n++
		}
	}
	return n
}

// MaxBatch bounds the members of one batch.
const MaxBatch = maxBatch

// Retryable reports whether the dialect d redoes a transaction after err.
func Retryable(d Dialect, err error) bool {
	x := dialects[d]
	return x.retryable(err)
}
