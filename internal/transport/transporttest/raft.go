//lint:file-ignore SA1019 raft v1.7.3 still reads the deprecated Leader, which a forged request sets as raft does

package transporttest

import (
	"strconv"
	"testing"

	"github.com/hashicorp/raft"
)

// RaftStat is r's statistic name (raft.Stats) as a number.
func RaftStat(t testing.TB, r *raft.Raft, name string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(r.Stats()[name], 10, 64)
	if err != nil {
		t.Fatalf("raft stat %s: %v", name, err)
	}
	return v
}

// NextAppend is an AppendEntries, sent as node as, that would append data
// as a command at follower r's next index, in its current term, and commit
// it: what a forger sends to write to a group it is no leader of.
func NextAppend(t testing.TB, r *raft.Raft, as string, data []byte) *raft.AppendEntriesRequest {
	t.Helper()
	last, lastTerm, term := r.LastIndex(), RaftStat(t, r, "last_log_term"), RaftStat(t, r, "term")
	return &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(as), Addr: []byte(as)},
		Term:      term, Leader: []byte(as), PrevLogEntry: last, PrevLogTerm: lastTerm, LeaderCommitIndex: last + 1,
		Entries: []*raft.Log{{Index: last + 1, Term: term, Type: raft.LogCommand, Data: data}},
	}
}
