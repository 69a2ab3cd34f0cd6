//lint:file-ignore SA1019 raft v1.7.3 still sends the deprecated Leader and Candidate, and the codec handle raft uses, which these tests forge

package transport

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/fuzzseed"
)

// feedBytes feeds b to c one byte at a time and returns how many bytes
// passed before the first error, and the error.
func feedBytes(c *rpcCheck, b []byte) (int, error) {
	for i := range b {
		if err := c.feed(b[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(b), nil
}

// TestRPCCheck_PassesRaftRequests: every request raft sends, of each type,
// one after the other and with a snapshot after an InstallSnapshot,
// passes whole, a byte at a time and in random pieces.
func TestRPCCheck_PassesRaftRequests(t *testing.T) {
	all := bytes.Join(validRPCs(t, "n1"), nil)
	all = append(all, all...)
	if err := newRPCCheck("n1", nil, nil, nil).feed(all); err != nil {
		t.Fatalf("whole: %v", err)
	}
	if n, err := feedBytes(newRPCCheck("n1", nil, nil, nil), all); err != nil {
		t.Fatalf("a byte at a time, at %d: %v", n, err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		c, rest := newRPCCheck("n1", nil, nil, nil), all
		for len(rest) > 0 {
			n := min(len(rest), 1+rng.IntN(5000))
			if err := c.feed(rest[:n]); err != nil {
				t.Fatal(err)
			}
			rest = rest[n:]
		}
		if c.state != csType {
			t.Fatalf("state %d after whole requests, want csType", c.state)
		}
	}
}

// mp builds msgpack by hand, for requests raft would never write.
type mp []byte

func (b mp) str(s string) mp  { return append(append(b, 0xa0|byte(len(s))), s...) }
func (b mp) fixmap(n int) mp  { return append(b, 0x80|byte(n)) }
func (b mp) raw(x ...byte) mp { return append(b, x...) }

// TestRPCCheck_RefusesOtherSenders: a request whose sender fields name
// another node than the connection's peer, lack them, or hide them in an
// encoding raft never writes (which hashicorp/go-msgpack would still
// read), fails the check before its last byte reaches raft.
func TestRPCCheck_RefusesOtherSenders(t *testing.T) {
	snap := []byte("snap")
	forgedAfterSnapshot := append(encodeRPC(t, 2, &raft.InstallSnapshotRequest{RPCHeader: header("n1"), Term: 1, Leader: []byte("n1"), Size: int64(len(snap))}, snap),
		encodeRPC(t, 0, &raft.AppendEntriesRequest{RPCHeader: header("n2"), Term: 9}, nil)...)
	deep := mp{0}.fixmap(3).str("ID").str("n1").str("Addr").str("n1").str("X")
	for range maxCheckDepth {
		deep = deep.raw(0x91)
	}
	deep = deep.raw(0xc0)
	cases := []struct {
		name string
		b    []byte
	}{
		{"OtherID", encodeRPC(t, 0, &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("n2"), Addr: []byte("n1")}, Term: 9}, nil)},
		{"OtherAddr", encodeRPC(t, 0, &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("n1"), Addr: []byte("n2")}, Term: 9}, nil)},
		{"OtherLeader", encodeRPC(t, 0, &raft.AppendEntriesRequest{RPCHeader: header("n1"), Leader: []byte("n2"), Term: 9}, nil)},
		{"OtherCandidate", encodeRPC(t, 1, &raft.RequestVoteRequest{RPCHeader: header("n1"), Candidate: []byte("n2"), Term: 9}, nil)},
		{"OtherSnapshotLeader", encodeRPC(t, 2, &raft.InstallSnapshotRequest{RPCHeader: header("n1"), Leader: []byte("n2")}, nil)},
		{"LongerID", encodeRPC(t, 3, &raft.TimeoutNowRequest{RPCHeader: header("n1" + strings.Repeat("x", 100))}, nil)},
		{"NoID", encodeRPC(t, 4, &raft.RequestPreVoteRequest{RPCHeader: raft.RPCHeader{Addr: []byte("n1")}}, nil)},
		{"NoAddr", encodeRPC(t, 4, &raft.RequestPreVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte("n1")}}, nil)},
		{"EmptyMap", mp{0}.fixmap(0)},
		{"SecondIDForged", mp{3}.fixmap(3).str("ID").str("n1").str("Addr").str("n1").str("ID").str("n2")},
		{"SecondIDNil", mp{3}.fixmap(3).str("ID").str("n1").str("Addr").str("n1").str("ID").raw(0xc0)},
		{"KeyAsArray", mp{3}.fixmap(3).str("ID").str("n1").str("Addr").str("n1").raw(0x92, 'I', 'D').str("n2")},
		{"IDAsArray", mp{3}.fixmap(2).str("ID").raw(0x92, 'n', '1').str("Addr").str("n1")},
		{"IDAsInteger", mp{3}.fixmap(2).str("ID").raw(0x01).str("Addr").str("n1")},
		{"RequestAsArray", mp{3}.raw(0x92).str("n1").str("n1")},
		{"RequestAsNil", mp{3}.raw(0xc0)},
		{"UnknownType", append([]byte{5}, encodeRPC(t, 3, &raft.TimeoutNowRequest{RPCHeader: header("n1")}, nil)[1:]...)},
		{"NeverUsedByte", mp{3}.fixmap(3).str("ID").str("n1").str("Addr").str("n1").str("X").raw(0xc1)},
		{"SnapshotSizeOverflow", mp{2}.fixmap(3).str("ID").str("n1").str("Addr").str("n1").str("Size").raw(0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)},
		{"SnapshotSizeAsString", mp{2}.fixmap(3).str("ID").str("n1").str("Addr").str("n1").str("Size").str("12")},
		{"TooDeep", deep},
		{"ForgedAfterSnapshot", forgedAfterSnapshot},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, err := feedBytes(newRPCCheck("n1", nil, nil, nil), c.b)
			if !errors.Is(err, errBadRPC) {
				t.Fatalf("passed %d of %d bytes: %v, want errBadRPC", n, len(c.b), err)
			}
			for _, s := range decodeRPCs(c.b[:n]) {
				if !s.is("n1") {
					t.Fatalf("raft decodes a request from %+v out of the bytes passed", s)
				}
			}
			if err := newRPCCheck("n1", nil, nil, nil).feed(c.b); !errors.Is(err, errBadRPC) {
				t.Fatalf("whole: %v, want errBadRPC", err)
			}
		})
	}
}

// FuzzRPCCheck: the check of an inbound raft stream never panics and
// allocates nothing; it gives the same answer whole and a byte at a time;
// and of the bytes it passes, raft's own decoder reads only requests whose
// sender fields all name the peer.
func FuzzRPCCheck(f *testing.F) {
	valid := validRPCs(f, "n1")
	for _, b := range valid {
		f.Add(b)
	}
	f.Add(bytes.Join(valid, nil))
	for _, b := range validRPCs(f, "n2") {
		f.Add(b)
	}
	f.Add([]byte(mp{3}.fixmap(3).str("ID").str("n1").str("Addr").str("n1").raw(0x92, 'I', 'D').str("n2")))
	f.Add([]byte(mp{2}.fixmap(3).str("ID").str("n1").str("Addr").str("n1").str("Size").raw(0x05)))
	f.Fuzz(func(t *testing.T, b []byte) {
		var whole error
		fuzzseed.CheckAlloc(t, len(b), func() { whole = newRPCCheck("n1", nil, nil, nil).feed(b) })
		n, err := feedBytes(newRPCCheck("n1", nil, nil, nil), b)
		if (whole == nil) != (err == nil) {
			t.Fatalf("%x: whole %v, a byte at a time %v", b, whole, err)
		}
		if err != nil && !errors.Is(err, errBadRPC) {
			t.Fatalf("%x: %v is not errBadRPC", b, err)
		}
		for _, s := range decodeRPCs(b[:n]) {
			if !s.is("n1") {
				t.Fatalf("%x: raft decodes a request from %+v out of the %d bytes passed", b, s, n)
			}
		}
	})
}

// TestRPCCheck_VoteWithheld: with a Vote that refuses the peer, a
// RequestVote or RequestPreVote fails the check before raft gets a byte
// of it, as errWithheld (not a refusal of the peer); with a Campaign
// that says no, a TimeoutNow does, and with a Lead that refuses the peer,
// an AppendEntries or an InstallSnapshot. With hooks that allow, every
// request passes.
func TestRPCCheck_VoteWithheld(t *testing.T) {
	for _, rpc := range validRPCs(t, "n1") {
		refuse := newRPCCheck("n1", func(candidate string) bool { return candidate != "n1" }, func() bool { return false },
			func(leader string) bool { return leader != "n1" })
		err := refuse.feed(rpc)
		switch rpc[0] {
		case rpcTypeRequestVote, rpcTypeRequestPreVote, rpcTypeTimeoutNow, rpcTypeAppendEntries, rpcTypeInstallSnapshot:
			if !errors.Is(err, errWithheld) {
				t.Fatalf("request type %d with the vote withheld: %v", rpc[0], err)
			}
		default:
			if err != nil {
				t.Fatalf("request type %d with the vote withheld: %v", rpc[0], err)
			}
		}
		if err := newRPCCheck("n1", func(string) bool { return true }, func() bool { return true }, func(string) bool { return true }).feed(rpc); err != nil {
			t.Fatalf("request type %d with the vote granted: %v", rpc[0], err)
		}
	}
}
