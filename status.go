package mq

// ClusterStatus is what a node knows of its cluster.
type ClusterStatus struct {
	NodeID string // this node's
	Addr   string // this node's advertised address
	Leader string // the metadata leader's node id, "" while none is known
	Nodes  []NodeStatus
	// Leading lists the replicated partitions (Raft3, DoubleWrite) whose
	// replica on this node leads now, as "topic/partition", sorted.
	Leading []string
}

// NodeStatus is one node as the metadata group records it.
type NodeStatus struct {
	ID   string
	Addr string
	Up   bool // false once its session expired, until it comes back
}

// ClusterStatus returns what the node knows of its cluster: the zero value
// for a standalone node.
func (m *MQ) ClusterStatus() ClusterStatus {
	if m.cluster == nil {
		return ClusterStatus{}
	}
	ns := m.cluster.Status()
	st := ClusterStatus{NodeID: ns.NodeID, Addr: ns.Addr, Leader: ns.Leader, Leading: ns.Leading}
	for _, nd := range ns.Nodes {
		st.Nodes = append(st.Nodes, NodeStatus{ID: nd.ID, Addr: nd.Addr, Up: nd.Up})
	}
	return st
}
