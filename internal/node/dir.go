package node

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/uuid"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/metastate"
)

// Errors of a node's directory.
var (
	// ErrWrongDir is returned by CheckDir for a directory its options do
	// not fit: a cluster node's opened standalone or under another id, or
	// a standalone node's with topics opened as a cluster node.
	ErrWrongDir = errors.New("node: the directory does not fit the options")
	// ErrCorrupt is returned by CheckDir for a damaged node file.
	ErrCorrupt = errors.New("node: corrupt node file")
)

// The node file, <dir>/cluster/node: nodeFileHeader, then the id of the
// cluster node whose directory this is, and a newline. A directory is one
// node's for its life: its raft log, its state and its partition files are
// that node's, placed by the cluster. Open writes the file the first time
// a directory opens as a cluster node, and refuses what does not fit it.
// A directory of an older release, which has a raft log but no file,
// takes the id it is opened with.
const nodeFileHeader = "zeze-mq node 1\n"

// CheckDir returns ErrWrongDir when dir is not the directory of node id,
// "" for a standalone node: a cluster node's opened standalone or under
// another id, or a standalone node's with topics opened as a cluster node.
// claim is true when a cluster node's directory has no node file yet: the
// caller writes it (Claim) once the node opened.
func CheckDir(dir, id string) (claim bool, err error) {
	cdir := filepath.Join(dir, "cluster")
	path := filepath.Join(cdir, "node")
	owner, found, err := boltsafe.ReadTagged(path, nodeFileHeader)
	switch {
	case errors.Is(err, boltsafe.ErrNotTagged) || found && metastate.CheckNodeID(owner) != nil:
		return false, fmt.Errorf("%w: %s is not a node file", ErrCorrupt, path)
	case err != nil:
		return false, fmt.Errorf("open %s: %w", path, err)
	}
	_, err = os.Stat(filepath.Join(cdir, "raft.db"))
	hasRaft := err == nil
	if id == "" {
		if owner != "" || hasRaft {
			return false, fmt.Errorf("%w: %s is the directory of cluster node %q: open it WithCluster", ErrWrongDir, dir, cmp.Or(owner, "?"))
		}
		return false, nil
	}
	if owner != "" && owner != id {
		return false, fmt.Errorf("%w: %s is the directory of cluster node %q, not %q", ErrWrongDir, dir, owner, id)
	}
	if owner == "" && !hasRaft {
		if ents, err := os.ReadDir(filepath.Join(dir, "topics")); err != nil || len(ents) > 0 {
			return false, fmt.Errorf("%w: %s holds the topics of a standalone node, which cannot join a cluster (%v)", ErrWrongDir, dir, err)
		}
	}
	return owner == "", nil
}

// Claim writes the node file of dir, naming node id.
func Claim(dir, id string) error {
	path := filepath.Join(dir, "cluster", "node")
	if err := boltsafe.WriteTagged(path, nodeFileHeader, id); err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	return nil
}

// The incarnation file, <dir>/cluster/incarnation: incarnationHeader, then
// a random id made at the directory's first Open as a cluster node, and a
// newline. The node registers with it (metastate.Node.Incarnation): a
// directory that lost its data, emptied or replaced, has none, gets a new
// one, and the metadata then knows that none of the node's replicas holds
// what it held.
const incarnationHeader = "zeze-mq incarnation 1\n"

// Incarnation returns the incarnation of dir, a cluster node's directory,
// making it at the first call. A damaged file is ErrCorrupt: the node
// would otherwise come back as a new incarnation, its replicas caught up
// anew, for a file an operator may restore.
func Incarnation(dir string) (string, error) {
	path := filepath.Join(dir, "cluster", "incarnation")
	id, found, err := boltsafe.ReadTagged(path, incarnationHeader)
	if _, perr := uuid.Parse(id); errors.Is(err, boltsafe.ErrNotTagged) || found && perr != nil {
		return "", fmt.Errorf("%w: %s is not an incarnation file", ErrCorrupt, path)
	} else if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	} else if found {
		return id, nil
	}
	id = uuid.NewString()
	if err := boltsafe.WriteTagged(path, incarnationHeader, id); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return id, nil
}
