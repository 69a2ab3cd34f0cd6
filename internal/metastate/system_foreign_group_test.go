package metastate

import "testing"

// TestAllowedSystem_ForeignGroupOffsets: a node whose rules name group h
// only may not move the offsets of another group. Consuming h's
// dead-letter topic in group "watch" (an operator's monitoring group) and
// the offsets of watch's own retry consumer of it, "watch%%DLQ%h", on
// watch's retry topic, are watch's: a right in h moves none of them.
func TestAllowedSystem_ForeignGroupOffsets(t *testing.T) {
	s := New()
	s.acl = []Rule{{Identity: "n2", Topic: "*", Rights: RightConsume | RightAdmin, Group: "h"},
		{Identity: "ops", Topic: "*", Rights: RightConsume | RightAdmin, Group: "watch"}}
	for _, c := range []struct {
		name, topic, offsets string
		right                Rights
	}{
		{"CommitWatchOnDLQ", "%DLQ%h", "watch", RightConsume},
		{"ResetWatchOnDLQ", "%DLQ%h", "watch", RightAdmin},
		{"ResetWatchRetryOffsetsOnWatchRetryTopic", "%RETRY%watch", "watch%%DLQ%h", RightAdmin},
		{"JoinWatchRetryTopic", "%RETRY%watch", "watch%%DLQ%h", RightConsume},
	} {
		t.Run(c.name, func(t *testing.T) {
			if s.AllowedSystem("n2", c.topic, c.offsets, c.right) {
				t.Errorf("n2 (rights in group h only) may %v %s for offsets %q of group watch", c.right, c.topic, c.offsets)
			}
		})
	}
}
