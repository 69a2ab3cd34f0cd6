package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/topicdb"
	"github.com/zeze-go/mq/store"
)

// A Single partition moves (metastate.MoveReplica) by copy, fenced by a
// freeze: the node it moves to (To) asks the partition's node (From) for
// it with OpMoveFetch at the move's version; From, once its own state
// shows that move, freezes the partition (store.OpFreeze, ordered after
// every command it acked, durable in its WAL), writes its snapshot beside
// the file and serves it in pieces; To restores it, synced, to the
// partition's path and ends the move with MoveDone, which makes it the
// partition's node. From acks nothing after the freeze, so the copy holds
// all it ever acked; To thaws its copy only once its state places the
// partition on it alone, and From deletes its own then. A cancelled move
// (the partition's node alone again, at a later version) thaws From's.
// Each side resumes after a crash from what its state and files show: To
// copies again from the start, From's freeze is in its file or WAL.

// OpMoveFetch asks for a piece of a Single partition's snapshot: a
// version byte (1), the topic (uvarint length and bytes), then uvarints
// partition, the move's version, the offset. The reply: the snapshot's
// size as a uvarint, then the bytes from the offset, at most movePiece.
const OpMoveFetch = remote.FirstOp + 90

const (
	moveFetchVersion  = 1
	movePiece         = 512 << 10   // with its reply's head, within the smallest frame a cluster allows (1 MiB and a message)
	moveSnapSuffix    = ".move"     // From's snapshot of the partition
	moveInSuffix      = ".incoming" // To's copy of it as it arrives
	moveRestoreSuffix = ".restore"  // To's partition file restored from it, before its rename
	goneSuffix        = ".gone"     // a node's tombstone of a partition it handed away
	moveRetry         = time.Second
)

// moveHold, when set, is called by the node a Single partition moves to
// once it holds the copy, before it ends the move: a seam for tests
// (SetMoveHold).
var moveHold atomic.Pointer[func(ctx context.Context, node string)]

// SetMoveHold has every node of this process call hold, until set again,
// once it holds the copy of a Single partition moving to it and before it
// ends the move; nil removes it. A seam for tests, which hold a move
// there to crash a node in the middle.
func SetMoveHold(hold func(ctx context.Context, node string)) {
	if hold == nil {
		moveHold.Store(nil)
		return
	}
	moveHold.Store(&hold)
}

// AppendMoveFetch appends an OpMoveFetch request to dst.
func AppendMoveFetch(dst []byte, topic string, index int, version, offset uint64) []byte {
	return appendTopicRequest(dst, moveFetchVersion, topic, uint64(index), version, offset)
}

func decodeMoveFetch(b []byte) (topic string, index int, version, offset uint64, err error) {
	var vs [3]uint64
	if topic, err = decodeTopicRequest(b, moveFetchVersion, vs[:]); err != nil || vs[0] >= metastate.MaxPartitions {
		return "", 0, 0, 0, errRequestFormat
	}
	return topic, int(vs[0]), vs[1], vs[2], nil
}

// appendTopicRequest appends a request of the node's own ops to dst: a
// version byte, the topic (uvarint length and bytes), then vs as uvarints.
func appendTopicRequest(dst []byte, version byte, topic string, vs ...uint64) []byte {
	dst = append(dst, version)
	dst = binary.AppendUvarint(dst, uint64(len(topic)))
	dst = append(dst, topic...)
	for _, v := range vs {
		dst = binary.AppendUvarint(dst, v)
	}
	return dst
}

// decodeTopicRequest decodes what appendTopicRequest made at version,
// with len(vs) uvarints, into vs; nothing may follow them.
func decodeTopicRequest(b []byte, version byte, vs []uint64) (string, error) {
	if len(b) < 1 || b[0] != version {
		return "", errRequestFormat
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) || n > metastate.MaxNameLen {
		return "", errRequestFormat
	}
	topic := string(b[k : k+int(n)])
	b = b[k+int(n):]
	for i := range vs {
		if vs[i], k = binary.Uvarint(b); k <= 0 {
			return "", errRequestFormat
		}
		b = b[k:]
	}
	if len(b) != 0 {
		return "", errRequestFormat
	}
	return topic, nil
}

// moveSnap is the snapshot a partition's node hands over: made once per
// move version, read in pieces.
type moveSnap struct {
	mu      sync.Mutex
	version uint64
	size    int64
	f       *os.File
}

// handOver freezes the partition here at version, unless it is already,
// and returns the piece of its snapshot at offset and the snapshot's size.
func (s *single) handOver(ctx context.Context, path string, version, offset uint64) ([]byte, int64, error) {
	local, err := s.served()
	if err != nil {
		return nil, 0, err
	}
	switch f := local.Frozen(); {
	case f > version:
		// Frozen by a later move: the caller's move, which this node's
		// state still shows, is over.
		return nil, 0, fmt.Errorf("%w: %s is frozen by a later move (%d, not %d)", metastate.ErrStale, s.name, f, version)
	case f != version:
		if _, err := local.Apply(ctx, &store.Command{Op: store.OpFreeze, Offset: version}); err != nil {
			return nil, 0, err
		}
		s.kick() // the upkeep stops
	}
	s.snap.mu.Lock()
	defer s.snap.mu.Unlock()
	if s.snap.f == nil || s.snap.version != version {
		s.dropSnapLocked()
		f, err := os.OpenFile(path+moveSnapSuffix, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return nil, 0, err
		}
		if _, err := local.WriteSnapshot(f); err != nil {
			f.Close()
			return nil, 0, err
		}
		size, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		s.snap.f, s.snap.version, s.snap.size = f, version, size
	}
	if offset > uint64(s.snap.size) {
		return nil, 0, fmt.Errorf("%w: offset %d past the snapshot's %d bytes", errRequestFormat, offset, s.snap.size)
	}
	piece := make([]byte, min(int64(movePiece), s.snap.size-int64(offset)))
	if _, err := s.snap.f.ReadAt(piece, int64(offset)); err != nil {
		return nil, 0, err
	}
	return piece, s.snap.size, nil
}

func (s *single) dropSnap() {
	s.snap.mu.Lock()
	defer s.snap.mu.Unlock()
	s.dropSnapLocked()
}

func (s *single) dropSnapLocked() {
	if s.snap.f != nil {
		_ = s.snap.f.Close()
		_ = os.Remove(s.snap.f.Name())
		s.snap.f = nil
	}
}

// moveFetch serves OpMoveFetch to node peer, which must be the node the
// partition moves to at the request's version, as this node's state
// shows, waiting a little for it.
func (n *Node) moveFetch(ctx context.Context, peer string, req []byte) ([]byte, error) {
	if n.started.Load() == nil {
		return nil, errStarting
	}
	topic, index, version, offset, err := decodeMoveFetch(req)
	if err != nil {
		return nil, err
	}
	self := n.agent.ID()
	moving := func(st *metastate.State) bool {
		t, ok := st.Topic(topic)
		if !ok || t.Type != metastate.TypeSingle || index >= len(t.Parts) {
			return false
		}
		p := t.Parts[index]
		return p.Version == version && slices.Equal(p.Replicas, []string{self, peer})
	}
	if !n.awaitState(moving) {
		return nil, n.refuse(peer, fmt.Sprintf("move\x00%s/%d", topic, index),
			fmt.Errorf("%w: %s/%d is not moving from %s to %s at version %d", cluster.ErrDenied, topic, index, self, peer, version))
	}
	s := n.singleAt(topic, index)
	if s == nil {
		return nil, fmt.Errorf("%w: %s/%d is not open on node %s", store.ErrClosed, topic, index, self)
	}
	piece, size, err := s.handOver(ctx, topicdb.PartitionPath(n.dir, topic, index), version, offset)
	if err != nil {
		return nil, err
	}
	return append(binary.AppendUvarint(make([]byte, 0, len(piece)+10), uint64(size)), piece...), nil
}

// singleAt returns the table's Single partition index of topic, nil if it
// has none.
func (n *Node) singleAt(topic string, index int) *single {
	t, ok := n.cfg.Topics.Get(topic)
	if !ok || index < 0 || index >= len(t.Parts) {
		return nil
	}
	s, _ := t.Parts[index].(*single)
	return s
}

// moveIn copies partition index of topic from node from, the move at
// version moving it here, and ends the move (MoveDone), trying again
// until it is done, ctx ends, or the move is no longer this one.
func (n *Node) moveIn(ctx context.Context, topic string, index int, from string, version uint64) {
	logger := n.cfg.Logger.With("topic", topic, "partition", index, "from", from, "version", version)
	path := topicdb.PartitionPath(n.dir, topic, index)
	for {
		err := n.copyIn(ctx, topic, index, from, version, path)
		if hold := moveHold.Load(); err == nil && hold != nil {
			(*hold)(ctx, n.agent.ID())
			err = ctx.Err()
		}
		if err == nil {
			_, err = n.agent.Propose(ctx, metastate.MoveDone{Topic: topic, Partition: index, Version: version, To: n.agent.ID()})
			if err == nil {
				logger.Info("partition moved here")
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, metastate.ErrStale) {
			return // the move changed: the next sync says what now
		}
		logger.Warn("partition not moved here yet; trying again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(moveRetry):
		}
	}
}

// copyIn fetches the partition's snapshot from node from into
// path+".incoming" and restores it, synced, as the partition file at path.
func (n *Node) copyIn(ctx context.Context, topic string, index int, from string, version uint64, path string) error {
	c, err := n.agent.Peer(from)
	if err != nil {
		return err
	}
	if err := store.MkdirAll(filepath.Dir(path)); err != nil {
		return err
	}
	if done, err := replaceable(path, version); err != nil || done {
		return err
	}
	in := path + moveInSuffix
	f, err := os.OpenFile(in, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		f.Close()
		_ = os.Remove(in)
	}()
	fetch := func(off uint64) ([]byte, error) {
		return c.Call(ctx, OpMoveFetch, AppendMoveFetch(nil, topic, index, version, off))
	}
	if err := fetchPieces(fetch, f); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	tmp := path + moveRestoreSuffix
	_ = os.Remove(tmp)
	if err := store.RestoreSnapshot(tmp, f); err != nil {
		return err
	}
	if done, err := replaceable(path, version); err != nil || done { // a state behind started this copy
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	// The copy is in place, durably, before the tombstone goes: never
	// neither.
	if err := boltsafe.SyncDir(filepath.Dir(path)); err != nil {
		return err
	}
	if err := store.RemoveFile(path + goneSuffix); err != nil {
		return err
	}
	return boltsafe.SyncDir(filepath.Dir(path))
}

// fetchPieces writes to w the snapshot fetch returns in pieces, each
// reply the snapshot's size then the bytes from the offset asked. A reply
// that is not such a piece, whose size is not the first one's, or that
// brings nothing before the end is errRequestFormat: a peer cannot make it
// write more than the size its first piece gave.
func fetchPieces(fetch func(off uint64) ([]byte, error), w io.Writer) error {
	var total uint64
	for off := uint64(0); ; {
		resp, err := fetch(off)
		if err != nil {
			return err
		}
		size, k := binary.Uvarint(resp)
		if off == 0 {
			total = size
		}
		switch {
		case k <= 0 || size != total || uint64(len(resp)-k) > size-off:
			return fmt.Errorf("%w: a piece of %d bytes at %d of %d (first said %d)", errRequestFormat, len(resp)-max(k, 0), off, size, total)
		case len(resp) == k && off < size:
			return fmt.Errorf("%w: an empty piece at %d of %d", errRequestFormat, off, size)
		}
		if _, err := w.Write(resp[k:]); err != nil {
			return err
		}
		if off += uint64(len(resp) - k); off == size {
			return nil
		}
	}
}

// replaceable returns an error unless the partition file at path may be
// replaced by a copy moving here at version: absent, or a copy frozen by
// an earlier move; done when it is this move's copy already (made before
// a crash). A live file (not frozen), or one frozen by a later move,
// means the state that started the copy is behind this node's files, as
// a state cache saved before the move may be.
func replaceable(path string, version uint64) (done bool, err error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	frozen, err := store.FrozenAt(path)
	switch {
	case err != nil:
		return false, fmt.Errorf("%s holds a copy that cannot be read, kept: %w", path, err)
	case frozen == version:
		return true, nil
	case frozen == 0 || frozen > version:
		return false, fmt.Errorf("%w: %s holds a copy frozen at %d (0: live), newer than the move at %d: the move's state is behind", metastate.ErrStale, path, frozen, version)
	}
	return false, nil
}

// updateSingles brings each Single partition of the table to its record
// in st: opened here while it is placed here, its move started, the RPC
// partition of its node otherwise (placeSingle).
func (n *Node) updateSingles(st *metastate.State) {
	n.eachPart(st, metastate.TypeSingle, func(t metastate.Topic, i int, p partition.Partition) {
		if s, ok := p.(*single); ok {
			n.placeSingle(t.Name, i, s, t.Parts[i])
		}
	})
}

// placeSingle makes s follow its record rec: placed here (placeHere) or
// elsewhere (placeElsewhere); moving here, the copy is fetched (moveIn),
// once per move version.
func (n *Node) placeSingle(topic string, i int, s *single, rec metastate.Partition) {
	self := n.agent.ID()
	key := topic + "/" + strconv.Itoa(i)
	// The copy starts, or stops, once this node's own copy is placed:
	// closed and deleted when moved away, before any new copy lands.
	defer func() {
		if len(rec.Replicas) == 2 && rec.Replicas[1] == self {
			n.startMoveIn(key, topic, i, rec.Replicas[0], rec.Version)
		} else {
			n.stopMoveIn(key)
		}
	}()
	w, err := s.at()
	switch {
	case err != nil:
	case rec.Replicas[0] == self:
		n.placeHere(topic, i, s, w, rec)
	default:
		n.placeElsewhere(topic, i, s, w, rec)
	}
}

// placeHere opens the partition here, unless it is open, and thaws it
// when the record has it alone at a version past its freeze: the move
// ended here, or was cancelled. A state behind the freeze, such as a
// state cache saved before it, leaves it frozen.
func (n *Node) placeHere(topic string, i int, s *single, w where, rec metastate.Partition) {
	local := w.local
	if local == nil {
		if local = n.openHere(topic, i, rec); local == nil {
			return
		}
	}
	since := time.Time{}
	if f := local.Frozen(); len(rec.Replicas) == 1 && f != 0 && rec.Version > f {
		if _, err := local.Apply(n.ctx, &store.Command{Op: store.OpThaw}); err != nil {
			n.cfg.Logger.Error("cannot thaw a partition placed on this node", "topic", topic, "partition", i, "err", err)
		} else {
			since = time.Now()
			s.dropSnap()
			n.cfg.Logger.Info("partition thawed: its move ended", "topic", topic, "partition", i)
		}
	}
	if local != w.local || !since.IsZero() {
		s.set(where{local: local, since: since})
	}
}

// openHere opens partition i of topic, placed here by rec; nil, logged,
// when it cannot. A partition this node handed away (its tombstone) is
// not made anew from a state behind that move, and one moved here (a
// version past 0) must have its file.
func (n *Node) openHere(topic string, i int, rec metastate.Partition) *partition.Local {
	_, statErr := os.Stat(topicdb.PartitionPath(n.dir, topic, i))
	switch {
	case n.handedAway(topic, i):
		n.cfg.Logger.Warn("a partition moved away from this node is placed here by a state behind its move; it stays closed", "topic", topic, "partition", i)
		return nil
	case rec.Version > 0 && statErr != nil:
		n.cfg.Logger.Error("the file of a partition moved here is missing; it stays closed", "topic", topic, "partition", i, "err", statErr)
		return nil
	}
	l, err := partition.OpenLocal(n.cfg.Local, topic, i)
	if err != nil {
		n.cfg.Logger.Error("cannot open a partition placed on this node", "topic", topic, "partition", i, "err", err)
		return nil
	}
	return l
}

// placeElsewhere makes the RPC partition of the partition's node where
// calls go, closing this node's copy if it has one, which a move took:
// that copy is deleted (dropMovedAway).
func (n *Node) placeElsewhere(topic string, i int, s *single, w where, rec metastate.Partition) {
	owner := rec.Replicas[0]
	if w.far != nil && w.farNode == owner {
		return
	}
	c, err := n.agent.Peer(owner)
	if err != nil {
		n.cfg.Logger.Error("cannot reach a partition's node", "topic", topic, "partition", i, "node", owner, "err", err)
		return
	}
	s.set(where{far: remote.NewPartition(c, topic, i, remote.PartitionConfig{}), farNode: owner})
	s.dropSnap()
	n.dropMovedAway(topic, i, rec)
}

// dropMovedAway deletes this node's closed file of partition i of topic,
// placed elsewhere by rec, if a move took it from here: frozen by a move
// before rec's version. A file that is not frozen, or frozen by this
// version or a later one (rec is behind this node's files), is kept.
func (n *Node) dropMovedAway(topic string, i int, rec metastate.Partition) {
	path := topicdb.PartitionPath(n.dir, topic, i)
	if _, err := os.Stat(path); err != nil {
		return
	}
	frozen, err := store.FrozenAt(path)
	switch {
	case err != nil:
		n.cfg.Logger.Warn("a partition file of a partition placed elsewhere cannot be read", "topic", topic, "partition", i, "err", err)
	case frozen == 0:
		n.cfg.Logger.Error("a partition file of a partition placed elsewhere is kept: no move took it", "topic", topic, "partition", i, "path", path)
	case frozen < rec.Version:
		if err := removeFiles(path); err != nil {
			n.cfg.Logger.Warn("the file of a partition moved away is not deleted", "topic", topic, "partition", i, "err", err)
		} else {
			n.cfg.Logger.Info("partition moved away; its file is deleted", "topic", topic, "partition", i, "to", rec.Replicas[0])
		}
	}
}

// removeFiles deletes the partition file at path and the move's snapshot
// beside it, the partition moved away, leaving a tombstone (".gone") in
// their place, synced first: a state behind the move never has this node
// make the partition anew, empty.
func removeFiles(path string) error {
	if err := boltsafe.ReplaceFile(path+goneSuffix, nil); err != nil {
		return err
	}
	return errors.Join(store.RemoveFile(path), store.RemoveFile(path+moveSnapSuffix), store.RemoveFile(path+moveInSuffix),
		store.RemoveFile(path+moveRestoreSuffix))
}

// handedAway reports whether this node handed partition i of topic to
// another node: its tombstone is there and its file is not.
func (n *Node) handedAway(topic string, i int) bool {
	path := topicdb.PartitionPath(n.dir, topic, i)
	_, statErr := os.Stat(path)
	_, goneErr := os.Stat(path + goneSuffix)
	return statErr != nil && goneErr == nil
}

// startMoveIn starts moveIn for the partition named key, moving here from
// node from at version, unless it runs for that version already; one for
// another version stops. Called under n.mu.
func (n *Node) startMoveIn(key, topic string, i int, from string, version uint64) {
	if m, ok := n.movers[key]; ok {
		if m.version == version {
			return
		}
		m.stop()
	}
	ctx, cancel := context.WithCancel(n.ctx)
	if n.movers == nil {
		n.movers = map[string]mover{}
	}
	done := make(chan struct{})
	n.movers[key] = mover{version: version, cancel: cancel, done: done}
	n.wg.Go(func() {
		defer close(done)
		defer cancel()
		n.moveIn(ctx, topic, i, from, version)
	})
}

// stopMoveIn stops the moveIn of the partition named key, if one runs.
// Called under n.mu.
func (n *Node) stopMoveIn(key string) {
	if m, ok := n.movers[key]; ok {
		m.stop()
		delete(n.movers, key)
	}
}

// mover is a moveIn running.
type mover struct {
	version uint64
	cancel  context.CancelFunc
	done    chan struct{} // closed when it returned
}

// stop stops the moveIn and waits for it: two never write the same
// files.
func (m mover) stop() {
	m.cancel()
	<-m.done
}
