package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	bolt "go.etcd.io/bbolt"
)

func init() {
	register("raft-stock", "stock hashicorp/raft, P groups of 3 replicas on loopback TCP: one raft.Apply per message, a bbolt FSM that fsyncs each: the yardstick for raft3", runRaftStock)
}

// runRaftStock measures the simplest correct use of stock hashicorp/raft for
// a replicated queue: P groups of three replicas, node i holding replica i
// of every group, each replica on its own loopback TCP transport,
// raft-boltdb as log and stable store behind raft's LogCache of 512 as in
// raftqueue, file snapshots, and an FSM that appends each entry's message to
// a bbolt file in one Update, one fsync per message on every replica. Each
// send is one raft.Apply of one message to its group's leader; raft batches
// the entries of concurrent Applies into one log write and one
// AppendEntries, as it does for any user. Both raft cases use lanRaftConfig.
func runRaftStock(ctx context.Context, b *bench) (result, error) {
	gs, err := openRaftGroups(ctx, b, b.partitions, openStockReplica)
	if err != nil {
		return result{}, err
	}
	elapsed, err := gs.closedLoop(ctx, b, func(ctx context.Context, r *stockReplica, _ int, _ int64, _ int) error {
		f := r.raft.Apply(b.body, raftEnqueueTimeout)
		if err := f.Error(); err != nil {
			return err
		}
		if err, ok := f.Response().(error); ok {
			return err
		}
		return nil
	}, stockRetry)
	if cerr := gs.close(); err == nil {
		err = cerr
	}
	return result{elapsed: elapsed, note: gs.note()}, err
}

// stockRetry tells which errors of raft.Apply send again through the
// group's new leader: not leading, when nothing was appended, and
// leadership lost, when the outcome is unknown and the message may be
// stored twice, which gs.note counts.
func stockRetry(err error) bool {
	return errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress) ||
		errors.Is(err, raft.ErrLeadershipLost)
}

// raftEnqueueTimeout bounds raft.Apply's wait for the leader's queue.
const raftEnqueueTimeout = 10 * time.Second

// lanRaftConfig is the raft configuration of both raft cases: timeouts of a
// LAN with room for a loaded machine, 1 s, since with 200 ms leaders lost
// their lease under fsync load; and MaxAppendEntries 256, raftqueue's
// default where raft's is 64, so that raft-stock's one entry per message is
// not capped at 64 entries per log write and RPC. The rest are raft's
// defaults: CommitTimeout 50 ms, snapshots every 8192 entries checked every
// 120 s or more, so none in a run of seconds.
func lanRaftConfig() *raft.Config {
	c := raft.DefaultConfig()
	c.HeartbeatTimeout = time.Second
	c.ElectionTimeout = time.Second
	c.LeaderLeaseTimeout = time.Second
	c.MaxAppendEntries = 256
	c.Logger = hclog.NewNullLogger()
	return c
}

// stockReplica is one replica of a raft-stock group.
type stockReplica struct {
	raft *raft.Raft
	fsm  *stockFSM
	logs *raftboltdb.BoltStore
}

func openStockReplica(s replicaSpec) (*stockReplica, error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, err
	}
	conf := lanRaftConfig()
	conf.LocalID = s.id
	logs, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(s.dir, "raft.db")})
	if err != nil {
		return nil, err
	}
	cached, err := raft.NewLogCache(512, logs)
	if err != nil {
		logs.Close()
		return nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(s.dir, 2, conf.Logger)
	if err != nil {
		logs.Close()
		return nil, err
	}
	fsm, err := openStockFSM(filepath.Join(s.dir, "fsm.db"))
	if err != nil {
		logs.Close()
		return nil, err
	}
	r, err := raft.NewRaft(conf, fsm, cached, logs, snaps, s.tr)
	if err != nil {
		fsm.db.Close()
		logs.Close()
		return nil, err
	}
	return &stockReplica{raft: r, fsm: fsm, logs: logs}, nil
}

func (s *stockReplica) Raft() *raft.Raft { return s.raft }

func (s *stockReplica) Bootstrap(servers []raft.Server) error {
	return s.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
}

// Close shuts raft down, which closes its transport, then the files.
func (s *stockReplica) Close() error {
	err := s.raft.Shutdown().Error()
	if cerr := s.fsm.db.Close(); err == nil {
		err = cerr
	}
	if cerr := s.logs.Close(); err == nil {
		err = cerr
	}
	return err
}

// stockFSM appends each entry's data to bucket "log" of a bbolt file, keyed
// by its big-endian offset, and keeps the raft index of the last entry
// applied in bucket "meta" in the same transaction, so a restart that
// replays the log skips what the file holds. Apply returns the offset.
// raft calls Apply, Snapshot and Restore from one goroutine.
type stockFSM struct {
	path string
	db   *bolt.DB
}

var (
	stockLogBucket  = []byte("log")
	stockMetaBucket = []byte("meta")
	stockAppliedKey = []byte("applied")
)

func openStockFSM(path string) (*stockFSM, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(stockLogBucket); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(stockMetaBucket)
		return err
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &stockFSM{path: path, db: db}, nil
}

// Apply stores one message. It returns its offset, nil for an entry the
// file held already, or the error.
func (f *stockFSM) Apply(l *raft.Log) interface{} {
	var resp interface{}
	err := f.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(stockMetaBucket)
		if v := meta.Get(stockAppliedKey); len(v) == 8 && binary.BigEndian.Uint64(v) >= l.Index {
			return nil
		}
		lg := tx.Bucket(stockLogBucket)
		seq, err := lg.NextSequence()
		if err != nil {
			return err
		}
		off := seq - 1
		if err := lg.Put(binary.BigEndian.AppendUint64(nil, off), l.Data); err != nil {
			return err
		}
		resp = off
		return meta.Put(stockAppliedKey, binary.BigEndian.AppendUint64(nil, l.Index))
	})
	if err != nil {
		return fmt.Errorf("raft-stock fsm: %w", err)
	}
	return resp
}

// Snapshot opens a read transaction on the FSM's goroutine, so the copy
// Persist writes is the state at the snapshot's index.
func (f *stockFSM) Snapshot() (raft.FSMSnapshot, error) {
	tx, err := f.db.Begin(false)
	if err != nil {
		return nil, err
	}
	return stockSnapshot{tx}, nil
}

// Restore replaces the file with the snapshot's copy.
func (f *stockFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	tmp := f.path + ".restore"
	if err := writeSynced(tmp, rc); err != nil {
		return err
	}
	if err := f.db.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return err
	}
	g, err := openStockFSM(f.path)
	if err != nil {
		return err
	}
	f.db = g.db
	return nil
}

func writeSynced(path string, r io.Reader) error {
	out, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, r)
	if serr := out.Sync(); err == nil {
		err = serr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// stockSnapshot is the FSM's file as one read transaction saw it.
type stockSnapshot struct{ tx *bolt.Tx }

func (s stockSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.tx.WriteTo(sink); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s stockSnapshot) Release() { s.tx.Rollback() }

// raftReplica is one replica of a group, as both raft cases build it.
type raftReplica interface {
	Raft() *raft.Raft
	Bootstrap(servers []raft.Server) error
	Close() error
}

// raftGroups is P groups of three replicas in this process, for raft-stock
// and raft3. hashicorp/raft serves one group per transport, so every replica
// has a loopback TCP transport of its own: 3P listeners.
type raftGroups[R raftReplica] struct {
	reps    [][]R                    // [group][node]
	trans   []*raft.NetworkTransport // every replica's, closed by its raft
	leaders []atomic.Int32           // [group]: the node last seen leading
	index0  []uint64                 // [group]: the leader's last index when the loop started
	entries int64                    // log entries the groups' leaders appended during the loop
	msgs    int64                    // messages acknowledged during the loop
	retried atomic.Int64             // sends retried through a new leader
}

const raftNodes = 3

// replicaSpec is what opening one replica needs: node n's replica of group
// g, its directory inside node n's, raft id and transport.
type replicaSpec struct {
	node, group int
	dir         string
	id          raft.ServerID
	tr          raft.Transport
}

// openRaftGroups opens -p groups of raftNodes replicas with open, replica
// i of each group in node i's directory, bootstraps them and waits until
// every group has a leader. On error it closes what it opened.
func openRaftGroups[R raftReplica](ctx context.Context, b *bench, groups int, open func(replicaSpec) (R, error)) (gs *raftGroups[R], err error) {
	gs = &raftGroups[R]{leaders: make([]atomic.Int32, groups), index0: make([]uint64, groups)}
	defer func() {
		if err != nil {
			err = errors.Join(err, gs.close())
			gs = nil
		}
	}()
	for p := range groups {
		gs.reps = append(gs.reps, nil)
		var servers []raft.Server
		for n := range raftNodes {
			tr, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 3, 10*time.Second, hclog.NewNullLogger())
			if err != nil {
				return gs, err
			}
			gs.trans = append(gs.trans, tr)
			id := raft.ServerID(fmt.Sprintf("n%d", n))
			r, err := open(replicaSpec{node: n, group: p, dir: filepath.Join(b.dir, string(id), fmt.Sprintf("g%d", p)), id: id, tr: tr})
			if err != nil {
				tr.Close()
				return gs, fmt.Errorf("group %d replica %s: %w", p, id, err)
			}
			gs.reps[p] = append(gs.reps[p], r)
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: id, Address: tr.LocalAddr()})
		}
		if err := gs.reps[p][0].Bootstrap(servers); err != nil {
			return gs, fmt.Errorf("group %d: bootstrap: %w", p, err)
		}
	}
	for p := range gs.reps {
		if _, err := gs.leader(ctx, p); err != nil {
			return gs, err
		}
	}
	return gs, nil
}

// leader waits until a replica of group p leads and returns it.
func (gs *raftGroups[R]) leader(ctx context.Context, p int) (R, error) {
	var r R
	err := waitUntil(ctx, 20*time.Second, fmt.Sprintf("a leader of group %d", p), func() bool {
		for n, rep := range gs.reps[p] {
			if rep.Raft().State() == raft.Leader {
				gs.leaders[p].Store(int32(n))
				r = rep
				return true
			}
		}
		return false
	})
	return r, err
}

// closedLoop runs b.closedLoop with each send going to its group's leader,
// the groups spread as in ceiling-p: send(ctx, leader, w, seq, attempt) is
// tried again, with attempt+1, through the group's leader whenever retry
// says its error means that the replica did not lead.
func (gs *raftGroups[R]) closedLoop(ctx context.Context, b *bench, send func(ctx context.Context, r R, w int, seq int64, attempt int) error, retry func(error) bool) (time.Duration, error) {
	for p, reps := range gs.reps {
		gs.index0[p] = reps[gs.leaders[p].Load()].Raft().LastIndex()
	}
	n0 := b.meter.count.Load()
	elapsed, err := b.closedLoop(ctx, func(ctx context.Context, w int, seq int64) error {
		p := benchKey(w, seq) % len(gs.reps)
		r := gs.reps[p][gs.leaders[p].Load()]
		for attempt := 0; ; attempt++ {
			err := send(ctx, r, w, seq, attempt)
			if err == nil || !retry(err) || ctx.Err() != nil {
				return err
			}
			gs.retried.Add(1)
			if r, err = gs.leader(ctx, p); err != nil {
				return err
			}
		}
	})
	gs.msgs = b.meter.count.Load() - n0
	for p, reps := range gs.reps {
		gs.entries += int64(reps[gs.leaders[p].Load()].Raft().LastIndex() - gs.index0[p])
	}
	return elapsed, err
}

// note reports the messages per log entry and the retries.
func (gs *raftGroups[R]) note() string {
	s := ""
	if gs.entries > 0 {
		s = fmt.Sprintf("%.1f msgs/entry", float64(gs.msgs)/float64(gs.entries))
	}
	if n := gs.retried.Load(); n > 0 {
		s += fmt.Sprintf(", %d sends retried after a leader change", n)
	}
	return s
}

// close closes every replica, then every transport's pooled connections,
// which NetworkTransport.Close leaves open, and with them the peers'
// connection goroutines. It returns the first error.
func (gs *raftGroups[R]) close() error {
	var err error
	for _, reps := range gs.reps {
		for _, r := range reps {
			if cerr := r.Close(); err == nil {
				err = cerr
			}
		}
	}
	for _, tr := range gs.trans {
		tr.Close()
		tr.CloseStreams()
	}
	return err
}
