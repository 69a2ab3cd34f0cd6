package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/metastate"
)

// A metadata replica that starts without raft state, and not to start a
// new cluster, may be a voter whose disk was lost: the group's
// configuration still names it a voter, and raft's safety needs a voter
// to remember its log and its votes. Until the group has registered its
// incarnation (metastate.RegisterNode), after removing the old one from
// the voters (AddNode), it neither votes nor campaigns
// (transport.LayerConfig.Vote and Campaign): with its log empty it would
// grant a lagging candidate, lacking entries it had itself acknowledged
// before, or grant a second candidate a term it had voted in already. A
// node joining for the first time waits alike, for nothing: it is no
// voter yet.
//
// The vote file, <Dir>/novote: voteFileHeader, then the incarnation, and
// a newline. Made before raft's first state, removed once the state
// shows the node registered with its incarnation: a restart in between
// still withholds.
const voteFileHeader = "zeze-mq metadata votes withheld 1\n"

func voteFilePath(dir string) string { return filepath.Join(dir, "novote") }

// openVoteGate decides, before raft starts, whether this replica votes:
// not while the vote file is there, which it makes for a replica without
// state that does not start a new cluster. With the file there and
// state, raft's log may show the node registered already (a crash before
// the file went): then it votes again.
func (m *Meta) openVoteGate(existing, bootstrap bool, logs raft.LogStore) error {
	path := voteFilePath(m.dir)
	_, found, err := boltsafe.ReadTagged(path, voteFileHeader)
	switch {
	case errors.Is(err, boltsafe.ErrNotTagged):
		return fmt.Errorf("%w: %s is not a vote file", metastate.ErrCorrupt, path)
	case err != nil:
		return fmt.Errorf("open %s: %w", path, err)
	}
	if !found && (existing || bootstrap) {
		return nil
	}
	if !found {
		if err := boltsafe.WriteTagged(path, voteFileHeader, voteFileValue(m.inc)); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	m.noVote.Store(true)
	m.voteLog = logs
	if existing && m.registeredInLog() {
		return m.votesAgain()
	}
	return nil
}

// voteFileValue is what the vote file holds: the incarnation, or a dash
// for a node without one (tests of the metadata group alone).
func voteFileValue(inc string) string {
	if inc == "" {
		return "-"
	}
	return inc
}

// MayVote reports whether this metadata replica may vote and campaign.
func (m *Meta) MayVote() bool { return !m.noVote.Load() }

// checkVote lets this replica vote again once the state it applied shows
// its node registered with its incarnation, or its log holds that
// registration, not yet known committed: the leader that proposed it may
// need this vote to lead again. The session loop calls it.
func (m *Meta) checkVote() {
	if !m.noVote.Load() {
		return
	}
	if nd, ok := m.State().Node(m.id); ok && nd.Incarnation == m.inc || m.registeredInLog() {
		if err := m.votesAgain(); err != nil {
			m.log.Warn("metadata replica cannot record that it votes again", "err", err)
		}
	}
}

// VotesAgain lets this replica vote from now on: another node's state
// shows its node registered with its incarnation (Agent.checkVote).
func (m *Meta) VotesAgain() error {
	if !m.noVote.Load() {
		return nil
	}
	return m.votesAgain()
}

// votesAgain removes the vote file, durably, then lets raft vote.
func (m *Meta) votesAgain() error {
	path := voteFilePath(m.dir)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := boltsafe.SyncDir(m.dir); err != nil {
		return err
	}
	m.noVote.Store(false)
	m.log.Info("metadata replica registered with its incarnation: it votes again", "incarnation", m.inc)
	return nil
}

// registeredInLog reports whether raft's log holds a registration of this
// node with its incarnation, committed or not: a leader proposes one only
// once the node is no voter of an older incarnation (AddNode). It reads
// each entry once: the entries it read before are not read again.
func (m *Meta) registeredInLog() bool {
	logs := m.voteLog
	if logs == nil {
		return false
	}
	first, err := logs.FirstIndex()
	if err != nil {
		return false
	}
	last, err := logs.LastIndex()
	if err != nil {
		return false
	}
	var e raft.Log
	for i := max(first, m.voteScanned+1, 1); i <= last; i++ {
		m.voteScanned = i
		if logs.GetLog(i, &e) != nil || e.Type != raft.LogCommand {
			continue
		}
		if c, err := metastate.DecodeCommand(e.Data); err == nil {
			if r, ok := c.(metastate.RegisterNode); ok && r.ID == m.id && r.Incarnation == m.inc {
				return true
			}
		}
	}
	return false
}

// Raft is the metadata group's raft, for status and tests.
func (m *Meta) Raft() *raft.Raft { return m.raft }
