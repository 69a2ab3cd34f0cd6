package mq

// ClusterStatus is what a node knows of its cluster.
type ClusterStatus struct {
	NodeID string // this node's
	Addr   string // this node's advertised address
	// ClusterID is the cluster's id, made by the node that started it and
	// recorded in every node's directory; "" until this node knows it.
	ClusterID string
	Leader    string // the metadata leader's node id, "" while none is known
	Nodes     []NodeStatus
	// Leading lists the replicated partitions (Raft3, DoubleWrite) whose
	// replica on this node leads now, as "topic/partition", sorted.
	Leading []string
	// Failed holds the DoubleWrite partitions whose record makes this node
	// the leader while its replica cannot serve them, by
	// "topic/partition", with why: it could not be opened or take the
	// lead, or no intact copy is known (the leader's data directory was
	// replaced while no follower was in sync). Sends to them fail at
	// once; the pair is handed to its follower when that one is in sync.
	Failed map[string]string
}

// NodeStatus is one node as the metadata group records it.
type NodeStatus struct {
	ID   string
	Addr string
	Up   bool // false once its session expired, until it comes back
	// Draining is set by DrainNode until ResumeNode: its replicas move
	// to other nodes.
	Draining bool
	// Holds lists the partitions with a replica on the node, as
	// "topic/partition": empty once a draining node is drained.
	Holds []string
}

// ClusterStatus returns what the node knows of its cluster: the zero value
// for a standalone node.
func (m *MQ) ClusterStatus() ClusterStatus {
	if m.cluster == nil {
		return ClusterStatus{}
	}
	ns := m.cluster.Status()
	st := ClusterStatus{NodeID: ns.NodeID, Addr: ns.Addr, ClusterID: ns.ClusterID, Leader: ns.Leader, Leading: ns.Leading}
	for name, err := range ns.Failed {
		if st.Failed == nil {
			st.Failed = map[string]string{}
		}
		st.Failed[name] = err.Error()
	}
	for _, nd := range ns.Nodes {
		st.Nodes = append(st.Nodes, NodeStatus{ID: nd.ID, Addr: nd.Addr, Up: nd.Up, Draining: nd.Draining, Holds: ns.Holds[nd.ID]})
	}
	return st
}
