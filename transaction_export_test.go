package mq

// Hooks into transaction.go for the external tests of package mq_test.

// TxDecided returns the decision recorded for txid in any partition of m,
// without changing anything.
func TxDecided(m *MQ, txid string) TxDecision { return m.txn().decided(txid) }

// SetTxTestHook makes f run at the named points of every transaction's life
// (see txTestHook). Only crash-test children set it, before any transaction.
func SetTxTestHook(f func(point, txid string)) { txTestHook = f }

// PendingTxs counts the transactions with undecided half messages in m.
func PendingTxs(m *MQ) (int, error) {
	all, err := m.txn().halves()
	return len(all), err
}
