package mq

// startBackground starts the node's background goroutines (each through
// goFunc, so Close cancels and waits for them).
func (m *MQ) startBackground() {
	m.startMaintenance() // maintenance.go: delay release, retention, dedup pruning
	m.startTxChecker()   // transaction.go, internal/txn: check-back, sweep, forgetter
}
