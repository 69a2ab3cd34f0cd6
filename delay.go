package mq

import "time"

// DeliverAfter sets m.DeliverAt to d from now and returns m, for a relative
// delay:
//
//	p.SendMessage(ctx, (&mq.Message{Key: k, Body: b}).DeliverAfter(30*time.Second))
//
// "Now" is the system clock at the call; a node opened WithClock compares
// DeliverAt with its own clock. A d of zero or less delivers at once.
//
// A delayed message is held in its partition's delay index and moved into
// the log when due: it is delivered no earlier than DeliverAt and, on an
// idle node, a few milliseconds after it. It gets its offset when it is
// moved (SendMessage reports Offset -1 and Delayed), so it is ordered among
// the other messages by due time, not send time; messages with the same due
// time keep their send order. Delayed messages survive a restart.
func (m *Message) DeliverAfter(d time.Duration) *Message {
	m.DeliverAt = time.Now().Add(d)
	return m
}
