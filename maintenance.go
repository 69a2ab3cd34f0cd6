package mq

// startMaintenance starts the node's store upkeep: releasing due delayed
// messages, retention and dedup pruning.
func (m *MQ) startMaintenance() {}
