package mq_test

import (
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestConsumer_RetryPropertiesNil: a message sent without Properties is
// presented with nil Properties; its Concurrent-mode retry is presented with
// an empty, non-nil map. Promise: a retried message is presented as its
// original (the user's properties).
func TestConsumer_RetryPropertiesNil(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "orders", 1)
	publish(t, m, "orders", "a")
	s := &sink{fail: func(msg *mq.Message, seen []*mq.Message) error {
		if len(seen) == 0 {
			return errBoom
		}
		return nil
	}}
	consume(t, m, "orders", "billing", s, mq.WithConsumeMode(mq.Concurrent), mq.WithRetryLadder(0))
	waitFor(t, 10*time.Second, "the retry", func() bool { return s.len() >= 2 })
	got := s.all()
	first, retry := got[0], got[1]
	if (first.Properties == nil) != (retry.Properties == nil) {
		t.Fatalf("original presented with Properties %#v, its retry with %#v", first.Properties, retry.Properties)
	}
}

// TestConsumer_RetryOfDeadLetterProperties: a group consuming a dead-letter
// topic in Concurrent mode fails a dead letter once; the retry is presented
// without the dead letter's own ORIGIN_MSG_ID and LAST_ERROR (failedCopy
// overwrites them without saving them, present deletes them), so it is not
// presented as the message first delivered.
func TestConsumer_RetryOfDeadLetterProperties(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "orders", 1)
	publish(t, m, "orders", "a")
	consume(t, m, "orders", "billing", &sink{fail: func(*mq.Message, []*mq.Message) error { return errors.New("first group gives up") }},
		mq.WithMaxReconsumeTimes(0))
	s := &sink{fail: func(msg *mq.Message, seen []*mq.Message) error {
		if len(seen) == 0 {
			return errBoom
		}
		return nil
	}}
	consume(t, m, mq.DeadLetterTopic("billing"), "audit", s, mq.WithConsumeMode(mq.Concurrent), mq.WithRetryLadder(0))
	waitFor(t, 10*time.Second, "the retry of the dead letter", func() bool { return s.len() >= 2 })
	got := s.all()
	first, retry := got[0], got[1]
	if first.ID != retry.ID || first.Topic != retry.Topic || first.Offset != retry.Offset {
		t.Fatalf("retry presented as %s/%d/%s, original %s/%d/%s", retry.Topic, retry.Offset, retry.ID, first.Topic, first.Offset, first.ID)
	}
	if !maps.Equal(first.Properties, retry.Properties) {
		t.Fatalf("dead letter first presented with Properties %v,\n its retry with %v", first.Properties, retry.Properties)
	}
}
