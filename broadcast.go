package mq

import "fmt"

// WithBroadcast makes the consumer a broadcasting member of its group: it
// gets every message of every partition, whatever other consumers of the
// group (on this node or others) get, and keeps its own offsets under the
// name group@instance (see Consumer.OffsetName).
//
// instance names the consumer and follows the group name rules. A consumer
// that opens again with the same group and instance, after a Close or a
// restart of the node, resumes where that instance stopped; a new instance
// starts at the start position (WithStartPosition). Consumers on this node
// that share group and instance share those offsets and divide the
// partitions between them, like a clustering group. To reset a
// broadcasting consumer, pass its OffsetName to ResetOffset.
func WithBroadcast(instance string) ConsumerOption {
	return func(c *consumerConfig) error {
		if err := checkName(instance, ErrInvalidOption); err != nil {
			return fmt.Errorf("broadcast instance: %w", err)
		}
		c.instance = instance
		return nil
	}
}
