package mq

import (
	"context"
	"errors"
	"fmt"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/delivery"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/node"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/internal/topicdb"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/txn"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// Errors returned by this package; compare with errors.Is.
var (
	// ErrClosed is returned by every method of a node, producer or consumer
	// after its Close.
	ErrClosed = errors.New("mq: closed")
	// ErrTopicExists is returned by CreateMQ for a topic that exists.
	ErrTopicExists = errors.New("mq: topic exists")
	// ErrNoTopic is returned for a topic that does not exist.
	ErrNoTopic = errors.New("mq: no such topic")
	// ErrInvalidTopic is returned for a topic name that is empty, longer
	// than 255 bytes, has characters other than letters, digits, '.', '_'
	// and '-', or starts with '%', which system topics reserve.
	ErrInvalidTopic = errors.New("mq: invalid topic name")
	// ErrInvalidPartition is returned for a partition count below 1 or above
	// MaxPartitions, or a partition index out of range.
	ErrInvalidPartition = errors.New("mq: invalid partition")
	// ErrPartitionDecrease is returned by AlterMQ when asked to shrink a topic.
	ErrPartitionDecrease = errors.New("mq: partitions can only grow")
	// ErrMessageTooLarge is returned by SendMessage, before anything is
	// written, for a message over the node's MaxMessageBytes.
	ErrMessageTooLarge = errors.New("mq: message too large")
	// ErrInvalidMessage is returned by SendMessage, PrepareMessage and
	// CommitMessage, before anything is written, for a message whose ID is
	// longer than MaxIDBytes, whose Timestamp is outside what int64 Unix
	// nanoseconds hold, 1677-09-21 to 2262-04-11, or whose DeliverAt is
	// after that range.
	ErrInvalidMessage = errors.New("mq: invalid message")
	// ErrUnsupportedType is returned by CreateMQ for a replication type this
	// node cannot provide, since DoubleWrite and Raft3 need a cluster, and
	// by SetACL on a standalone node.
	ErrUnsupportedType = errors.New("mq: replication type not supported here")
	// ErrInvalidOption is returned by Open, NewProducer and NewConsumer for a
	// bad option, and by Open for a directory its options do not fit: a
	// cluster node's opened without WithCluster or under another NodeID, or
	// a standalone node's with topics opened WithCluster. CreateMQ returns
	// it for Options out of range, ResolveTx for an unknown decision.
	ErrInvalidOption = errors.New("mq: invalid option")
	// ErrInvalidGroup is returned for a bad group name. Group names follow
	// the rules of topic names, but are at most 248 bytes: a group's retry
	// topic is named "%RETRY%" and the group.
	ErrInvalidGroup = errors.New("mq: invalid group name")
	// ErrNilMessage is returned by SendMessage for a nil *Message.
	ErrNilMessage = errors.New("mq: nil message")
	// ErrInvalidOffset is returned by ResetOffset and Seek for an offset past
	// the end of its partition.
	ErrInvalidOffset = errors.New("mq: invalid offset")
	// ErrTxDecided is returned by PrepareMessage when the transaction was
	// already committed or rolled back in a partition.
	ErrTxDecided = errors.New("mq: transaction already decided")
	// ErrNoMessage is returned by ReadMessage for an offset that holds no
	// message: not written yet, or already removed by retention.
	ErrNoMessage = errors.New("mq: no message at offset")
	// ErrCorrupt is returned, naming the file, when stored data fails its
	// checksum or a file is damaged, and by Open for a meta.db written by a
	// newer version.
	ErrCorrupt = errors.New("mq: corrupt data")
	// ErrNotInTransaction is returned by PrepareMessage and CommitMessage
	// when ctx carries no host transaction.
	ErrNotInTransaction = errors.New("mq: not in a transaction")
	// ErrNoQuorum is returned when a replicated partition cannot reach a
	// quorum before ctx ends.
	ErrNoQuorum = errors.New("mq: no quorum")
	// ErrUnknownOutcome is returned when a replicated partition's leader
	// was lost while a send or commit was being replicated: it may or may
	// not be stored. Sending the same *Message again stores it once: its
	// ID and partition are kept, and a copy already stored is found. The
	// same for CreateMQ and AlterMQ when the metadata leader was lost while
	// committing the change: it may still take effect.
	ErrUnknownOutcome = errors.New("mq: outcome unknown")
	// ErrGroupInUse is returned by DeleteGroup while a consumer of the
	// group is open on this node.
	ErrGroupInUse = errors.New("mq: group in use")
	// ErrDenied is returned when the cluster's ACL does not allow this
	// node the call (see SetACL).
	ErrDenied = errors.New("mq: denied by the cluster's ACL")
	// ErrStorageFailed is returned for every write to a partition after a
	// write or sync of its log or file failed, on an I/O error or a full
	// disk, until the node is reopened: the outcome of the writes in flight
	// is unknown, and nothing is retried and acknowledged. Resend with the
	// same IDs after reopening.
	ErrStorageFailed = errors.New("mq: storage failed")
	// ErrNodeInUse is returned by RemoveNode for a node that is still up,
	// or still holds replicas: drain it (DrainNode), wait until
	// ClusterStatus shows it holds nothing, shut it down, then remove it.
	ErrNodeInUse = errors.New("mq: node in use")
	// ErrNoNode is returned for a node id the cluster does not know.
	ErrNoNode = errors.New("mq: no such node")
)

// translate maps the errors of the internal packages to mq ones: the
// root translates at its edge.
func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, node.ErrWrongDir), errors.Is(err, transport.ErrConfig):
		return fmt.Errorf("%w: %v", ErrInvalidOption, err)
	case errors.Is(err, node.ErrNoTopic):
		return fmt.Errorf("%w: %v", ErrNoTopic, err)
	case errors.Is(err, store.ErrClosed):
		return fmt.Errorf("%w: %v", ErrClosed, err)
	case errors.Is(err, store.ErrCorrupt), errors.Is(err, boltsafe.ErrCorrupt), errors.Is(err, topicdb.ErrCorrupt),
		errors.Is(err, txn.ErrCorrupt), errors.Is(err, metastate.ErrCorrupt), errors.Is(err, node.ErrCorrupt):
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	case errors.Is(err, delivery.ErrClosed):
		return fmt.Errorf("%w: %v", ErrClosed, err)
	case errors.Is(err, delivery.ErrInvalidPartition):
		return fmt.Errorf("%w: %v", ErrInvalidPartition, err)
	case errors.Is(err, delivery.ErrInvalidOffset):
		return fmt.Errorf("%w: %v", ErrInvalidOffset, err)
	case errors.Is(err, delivery.ErrGroupInUse):
		return fmt.Errorf("%w: %v", ErrGroupInUse, err)
	case errors.Is(err, delivery.ErrNoOrigin):
		return fmt.Errorf("%w: %v", ErrNoTopic, err)
	case errors.Is(err, store.ErrDecided):
		return fmt.Errorf("%w: %v", ErrTxDecided, err)
	case errors.Is(err, store.ErrTooLarge):
		return fmt.Errorf("%w: %v", ErrMessageTooLarge, err)
	case errors.Is(err, cluster.ErrDenied):
		return fmt.Errorf("%w: %v", ErrDenied, err)
	case errors.Is(err, metastate.ErrTopicExists):
		return fmt.Errorf("%w: %v", ErrTopicExists, err)
	case errors.Is(err, metastate.ErrNoTopic):
		return fmt.Errorf("%w: %v", ErrNoTopic, err)
	case errors.Is(err, metastate.ErrPartitionDecrease):
		return fmt.Errorf("%w: %v", ErrPartitionDecrease, err)
	case errors.Is(err, metastate.ErrNodeUp), errors.Is(err, metastate.ErrNodeHolds):
		return fmt.Errorf("%w: %v", ErrNodeInUse, err)
	case errors.Is(err, metastate.ErrNoNode):
		return fmt.Errorf("%w: %v", ErrNoNode, err)
	case errors.Is(err, metastate.ErrNotEnoughNodes):
		return fmt.Errorf("%w: %v", ErrNoQuorum, err)
	case errors.Is(err, cluster.ErrNoSeeds):
		return fmt.Errorf("%w: %v", ErrInvalidOption, err)
	case errors.Is(err, replica.ErrNoInSync), errors.Is(err, replica.ErrReplicaFailed):
		return fmt.Errorf("%w: %v", ErrNoQuorum, err)
	case errors.Is(err, replica.ErrNoLeader): // and still the ctx's error that ended the wait
		return fmt.Errorf("%w: %w", ErrNoQuorum, err)
	case errors.Is(err, raftqueue.ErrUnknownOutcome), errors.Is(err, cluster.ErrUnknownOutcome):
		for _, cerr := range []error{context.DeadlineExceeded, context.Canceled} {
			if errors.Is(err, cerr) { // the caller's ctx ended: still its error too
				return fmt.Errorf("%w: %w (%v)", ErrUnknownOutcome, cerr, err)
			}
		}
		return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
	case errors.Is(err, cluster.ErrClosed):
		return fmt.Errorf("%w: %v", ErrClosed, err)
	case errors.Is(err, store.ErrFailed), errors.Is(err, store.ErrWALFailed):
		return fmt.Errorf("%w: %v", ErrStorageFailed, err)
	}
	return err
}

// clusterErr maps the error of a proposal through the metadata leader: a
// ctx that ended before a leader answered is ErrNoQuorum, still wrapping
// ctx's error; translate maps the others.
func clusterErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: %w", ErrNoQuorum, err)
	}
	return translate(err)
}
