package metastate

import "testing"

// TestState_AllowedSystem: a group's retry and dead-letter topics are the
// group's: the retry consumer's offsets need the right on their origin
// topic in the group, anything else the right in the group on some
// topic; a rule naming the system topic itself does not count.
func TestState_AllowedSystem(t *testing.T) {
	s := New()
	s.acl = []Rule{{Identity: "n2", Topic: "t", Rights: RightConsume, Group: "g"},
		{Identity: "n3", Topic: "t", Rights: RightConsume, Group: "mine"},
		{Identity: "n3", Topic: "%RETRY%g", Rights: RightConsume | RightAdmin},
		{Identity: "n4", Topic: "u", Rights: RightConsume | RightAdmin}}
	for _, c := range []struct {
		name, id, topic, offsets string
		right                    Rights
		want                     bool
	}{
		{"RetryOffsets", "n2", "%RETRY%g", "g%t", RightConsume, true},
		{"RetryOffsetsBroadcast", "n2", "%RETRY%g", "g@i%t", RightConsume, true},
		{"RetryOffsetsOtherTopic", "n2", "%RETRY%g", "g%u", RightConsume, false},
		{"RetryOffsetsReset", "n2", "%RETRY%g", "g%t", RightAdmin, false},
		{"Create", "n2", "%RETRY%g", "", RightConsume, true},
		{"DeadLetters", "n2", "%DLQ%g", "g", RightConsume, true},
		{"DeadLettersInAnotherGroup", "n2", "%DLQ%g", "h", RightConsume, false},
		{"OtherGroup", "n3", "%RETRY%g", "g%t", RightConsume, false},
		{"OtherGroupAppend", "n3", "%RETRY%g", "", RightConsume, false},
		{"OtherGroupOwnRetry", "n3", "%RETRY%mine", "mine%t", RightConsume, true},
		{"RetryOfDeadLetters", "n4", "%RETRY%h", "h%%DLQ%g", RightConsume, true},
		{"RetryOfDeadLettersNoRight", "n3", "%RETRY%h", "h%%DLQ%g", RightConsume, false},
		{"NotSystem", "n2", "t", "g", RightConsume, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := s.AllowedSystem(c.id, c.topic, c.offsets, c.right); got != c.want {
				t.Errorf("AllowedSystem(%s, %s, %q, %v) = %v, want %v", c.id, c.topic, c.offsets, c.right, got, c.want)
			}
		})
	}
}

// TestState_OwnsInGroup: a node owns a partition in a group when one of
// its members owns one of the group's, its broadcasting instances' or its
// retry consumers' partitions.
func TestState_OwnsInGroup(t *testing.T) {
	s := New()
	s.groups[GroupKey{"%RETRY%g", "g%t"}] = ConsumerGroup{Members: map[string]Member{"n1/1": {Node: "n1"}}, Owners: []string{"n1/1"}}
	s.groups[GroupKey{"t", "g@i"}] = ConsumerGroup{Members: map[string]Member{"n2/1": {Node: "n2"}}, Owners: []string{"", "n2/1"}}
	s.groups[GroupKey{"t", "h"}] = ConsumerGroup{Members: map[string]Member{"n3/1": {Node: "n3"}}, Owners: []string{""}}
	for _, c := range []struct {
		node, group string
		want        bool
	}{{"n1", "g", true}, {"n2", "g", true}, {"n3", "g", false}, {"n3", "h", false}, {"n1", "h", false}} {
		if got := s.OwnsInGroup(c.node, c.group); got != c.want {
			t.Errorf("OwnsInGroup(%s, %s) = %v, want %v", c.node, c.group, got, c.want)
		}
	}
}
