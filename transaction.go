package mq

// startTxChecker starts the check-back of half messages left undecided.
func (m *MQ) startTxChecker() {}
