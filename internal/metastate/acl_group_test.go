package metastate

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestState_AllowedGroup: a rule's group pattern limits its rights over
// group operations only; an empty one matches every group; a broadcasting
// consumer's group@instance is its group's.
func TestState_AllowedGroup(t *testing.T) {
	s := New()
	s.acl = []Rule{{Identity: "n2", Topic: "t", Rights: RightConsume, Group: "mine*"},
		{Identity: "n3", Topic: "t", Rights: RightConsume}}
	for _, c := range []struct {
		name, id, group string
		want            bool
	}{
		{"OK", "n2", "mine", true},
		{"Prefix", "n2", "mine-2", true},
		{"Broadcast", "n2", "mine@host1", true},
		{"OtherGroup", "n2", "g", false},
		{"OtherGroupBroadcast", "n2", "g@mine", false},
		{"NoGroupPattern", "n3", "g", true},
		{"NoRule", "n4", "mine", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := s.AllowedGroup(c.id, "t", c.group, RightConsume); got != c.want {
				t.Errorf("AllowedGroup(%s, t, %s) = %v, want %v", c.id, c.group, got, c.want)
			}
		})
	}
	if !s.Allowed("n2", "t", RightConsume) {
		t.Error("a rule limited to a group does not allow reading its topic")
	}
}

// TestDecodeCommand_SetACLVersion4: a SetACL of version 4, whose rules
// have no group, decodes with rules matching every group, and a version 5
// one keeps its groups through a snapshot.
func TestDecodeCommand_SetACLVersion4(t *testing.T) {
	body, err := msgpack.Marshal(&setACLV4{Rules: []ruleV4{{Identity: "n1", Topic: "*", Rights: RightAdmin}}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := DecodeCommand(append([]byte{cmdMagic, 4, kindSetACL}, body...))
	if err != nil {
		t.Fatal(err)
	}
	want := Rule{Identity: "n1", Topic: "*", Rights: RightAdmin}
	if got := c.(SetACL).Rules; len(got) != 1 || got[0] != want {
		t.Fatalf("version 4 rules %+v, want %+v", got, want)
	}
	s, _, err := New().Apply(1, SetACL{Rules: []Rule{{Identity: "n2", Topic: "t", Rights: RightConsume, Group: "mine"}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := EncodeSnapshot(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.ACL(); len(got) != 1 || got[0].Group != "mine" {
		t.Fatalf("rules after a snapshot: %+v", got)
	}
}
