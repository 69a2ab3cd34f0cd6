package localtx

import bolt "go.etcd.io/bbolt"

// SetBoltCommit makes b commit its transactions with commit, a test's
// stand-in for bbolt's Commit.
func SetBoltCommit(b *Bolt, commit func(*bolt.Tx) error) { b.commit = commit }
