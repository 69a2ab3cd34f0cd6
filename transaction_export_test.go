package mq

// Hooks into transaction.go for the external tests of package mq_test.

// TxDecided returns the decision recorded for txid in any partition of m,
// without changing anything.
func TxDecided(m *MQ, txid string) TxDecision { return m.txn().decided(txid) }

// PendingTxs counts the transactions with undecided half messages in m.
func PendingTxs(m *MQ) (int, error) {
	all, err := m.txn().halves()
	return len(all), err
}

// WithTxTestHook makes f run at the named points of the life of the node's
// transactions (see txConfig.testHook). The crash-test children set it.
func WithTxTestHook(f func(point, txid string)) Option {
	return func(c *config) error {
		c.tx.testHook = f
		return nil
	}
}
