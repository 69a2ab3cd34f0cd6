package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/remote"
)

// ErrNoSeeds is OpenAgent's refusal of a node with no metadata state, no
// seeds and no Bootstrap: it could join nothing, and starts a new cluster
// only when told to.
var ErrNoSeeds = errors.New("cluster: a node without state needs seeds to join, or Bootstrap to start a new cluster")

// The cluster file, <dir>/cluster/cluster: clusterFileHeader, then the id
// of the cluster whose member this directory is, and a newline. The node
// that starts a cluster makes the id; the others record it once their
// state shows it (metastate.State.ClusterID). A node presents it when it
// joins and heartbeats, and a leader of another cluster refuses it
// (metastate.ErrWrongCluster): a node never joins another cluster with
// its data.
const clusterFileHeader = "zeze-mq cluster 1\n"

func clusterPath(dir string) string { return filepath.Join(dir, "cluster") }

// readClusterID returns the cluster id dir records, "" if none.
func readClusterID(dir string) (string, error) {
	path := clusterPath(dir)
	id, _, err := boltsafe.ReadTagged(path, clusterFileHeader)
	switch {
	case errors.Is(err, boltsafe.ErrNotTagged) || len(id) > metastate.MaxNameLen:
		return "", fmt.Errorf("%w: %s is not a cluster file", metastate.ErrCorrupt, path)
	case err != nil:
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	return id, nil
}

// writeClusterID records id as the cluster of dir.
func writeClusterID(dir, id string) error {
	return boltsafe.WriteTagged(clusterPath(dir), clusterFileHeader, id)
}

// bootstrap reads the directory's cluster id and decides whether this
// node starts a new cluster: only with Bootstrap, only without metadata
// state, and only when no seed answers that it knows a leader, so that a
// node re-provisioned with its first configuration joins its cluster
// instead of starting a second. A node about to start one makes its id
// first. Without state, seeds or Bootstrap it is ErrNoSeeds.
func (n *Agent) bootstrap() (bool, error) {
	id, err := readClusterID(n.cfg.Dir)
	if err != nil {
		return false, err
	}
	n.clusterID.Store(id)
	if _, err := os.Stat(filepath.Join(n.cfg.Dir, "raft.db")); err == nil {
		return false, nil // a member already; raft ignores a bootstrap anyway
	}
	switch {
	case !n.cfg.Bootstrap && len(n.cfg.Seeds) == 0:
		return false, ErrNoSeeds
	case !n.cfg.Bootstrap || n.seedKnowsLeader():
		return false, nil
	}
	if id == "" {
		id = uuid.NewString()
		if err := writeClusterID(n.cfg.Dir, id); err != nil {
			return false, err
		}
		n.clusterID.Store(id)
	}
	n.log.Info("starting a new cluster", "cluster", id)
	return true, nil
}

// seedKnowsLeader reports whether a seed answers, within a few seconds,
// that it is a member of a cluster (opClusterOf; an older release's, that
// it knows a leader of its metadata group): a cluster runs there, perhaps
// electing a leader this moment.
func (n *Agent) seedKnowsLeader() bool {
	ctx, cancel := context.WithTimeout(context.Background(), max(n.timeout, 2*time.Second)) // before Open's n.ctx
	defer cancel()
	found := make(chan bool, len(n.cfg.Seeds))
	for _, addr := range n.cfg.Seeds {
		go func() {
			c, err := n.seed(seedPeer{addr: addr})
			if err != nil {
				found <- false
				return
			}
			resp, err := c.Call(ctx, opClusterOf, nil)
			if errors.Is(err, remote.ErrUnknownOp) {
				resp, err = c.Call(ctx, opWhoLeads, nil)
				var who whoLeads
				found <- err == nil && decodeMsg(resp, &who) == nil && who.ID != "" && who.ID != n.cfg.ID
				return
			}
			var of clusterOf
			found <- err == nil && decodeMsg(resp, &of) == nil && of.Member
		}()
	}
	for range n.cfg.Seeds {
		if <-found {
			n.log.Info("a seed is a member of a cluster: joining it rather than starting one")
			return true
		}
	}
	return false
}

// recordCluster records in the directory the cluster id its state shows,
// once it has one and the directory none.
func (n *Agent) recordCluster() {
	if n.clusterID.Load().(string) != "" {
		return
	}
	id := n.meta.State().ClusterID()
	if id == "" {
		return
	}
	if err := writeClusterID(n.cfg.Dir, id); err != nil {
		n.log.Warn("cannot record the cluster id", "cluster", id, "err", err)
		return
	}
	n.clusterID.Store(id)
}
