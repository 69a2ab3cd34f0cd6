package mq

import (
	"context"
	"fmt"
	"strings"
	"time"
)

type positionKind int

const (
	posFirst positionKind = iota
	posLast
	posTime
	posOffset
)

// Position is where ResetOffset moves a group. Build one with SeekFirst,
// SeekLast, SeekTime or SeekOffset.
type Position struct {
	kind   positionKind
	t      time.Time
	part   int
	offset uint64
}

// SeekFirst is the oldest message still stored, in every partition.
func SeekFirst() Position { return Position{kind: posFirst} }

// SeekLast is the end of every partition: only messages stored afterwards
// are delivered.
func SeekLast() Position { return Position{kind: posLast} }

// SeekTime is, in every partition, the first message stored at or after t
// (the end of the partition when there is none).
func SeekTime(t time.Time) Position { return Position{kind: posTime, t: t} }

// SeekOffset is offset in partition alone; the other partitions keep their
// position. An offset below the oldest stored message starts at the oldest
// (the skip is logged); one past the end is ErrInvalidOffset.
func SeekOffset(partition int, offset uint64) Position {
	return Position{kind: posOffset, part: partition, offset: offset}
}

func (p Position) String() string {
	switch p.kind {
	case posFirst:
		return "first"
	case posLast:
		return "last"
	case posTime:
		return "time " + p.t.Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("offset %d/%d", p.part, p.offset)
}

// seekReq asks a running worker to move to offset; the worker answers on
// done (buffered) once the offset is committed. The worker's seek channel
// holds one request, so a reset from its own handler need not wait.
type seekReq struct {
	offset uint64
	done   chan error
}

// ResetOffset moves the committed offset of group in topic's partitions to
// to. group is a consumer's OffsetName: the group, or group@instance for a
// broadcasting consumer. It works on a group that never consumed (it then
// starts there) and while the group's consumers run on this node: each
// running partition finishes the message in its handler (a message waiting
// to be retried is dropped from the wait), commits the new offset itself
// and goes on from there, so no message is delivered twice by the reset
// and no older commit overwrites it.
//
// Messages a Concurrent consumer parked in the group's retry topic are not
// affected.
//
// It returns ErrNoTopic, ErrInvalidGroup, ErrInvalidPartition,
// ErrInvalidOffset, ErrClosed, or ctx's error (a running partition may then
// still move when its handler returns). It waits for the handlers of the
// group on this node that are running; called from one of them with the
// ctx it was given, it does not wait for that one: the reset of its
// partition is applied when it returns, and its own result no longer
// counts for the group's offset.
func (m *MQ) ResetOffset(ctx context.Context, topic, group string, to Position) error {
	if err := checkOffsetName(group); err != nil {
		return err
	}
	_, parts, err := m.router.partitions(topic)
	if err != nil {
		return err
	}
	if to.kind == posOffset && (to.part < 0 || to.part >= len(parts)) {
		return fmt.Errorf("%w: partition %d of %s (0..%d)", ErrInvalidPartition, to.part, topic, len(parts)-1)
	}
	g, err := m.groupFor(topic, group)
	if err != nil {
		return err
	}
	// Hold the group still: no worker starts or stops while we reset.
	g.rebalanceMu.Lock()
	defer g.rebalanceMu.Unlock()
	for i, p := range parts {
		if to.kind == posOffset && i != to.part {
			continue
		}
		off, err := target(p, to)
		if err != nil {
			return fmt.Errorf("reset %s/%d for %s: %w", topic, i, group, err)
		}
		if err := g.moveTo(ctx, i, p, off); err != nil {
			return fmt.Errorf("reset %s/%d for %s: %w", topic, i, group, err)
		}
	}
	m.cfg.logger.Info("group offset reset", "topic", topic, "group", group, "to", to.String())
	return nil
}

// Seek moves the consumer's offsets (its OffsetName) in its topic to to; see
// ResetOffset.
func (c *Consumer) Seek(ctx context.Context, to Position) error {
	return c.m.ResetOffset(ctx, c.topic, c.group.name, to)
}

// checkOffsetName accepts a group name or group@instance.
func checkOffsetName(name string) error {
	g, inst, found := strings.Cut(name, "@")
	if err := checkName(g, ErrInvalidGroup); err != nil {
		return err
	}
	if found {
		if err := checkName(inst, ErrInvalidGroup); err != nil {
			return fmt.Errorf("%w (instance of %q)", err, name)
		}
	}
	return nil
}

// groupFor returns the node's group for (topic, offset name), registering an
// empty one if needed, so a consumer that joins during a reset waits for it.
func (m *MQ) groupFor(topic, name string) (*group, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	return m.groupLocked(topic, name), nil
}

// target resolves to in one partition.
func target(p partitionLog, to Position) (uint64, error) {
	st := p.Stats()
	switch to.kind {
	case posFirst:
		return st.Low, nil
	case posLast:
		return st.Next, nil
	case posTime:
		off, err := p.SeekTime(to.t.UnixNano())
		return off, translate(err)
	}
	if to.offset > st.Next {
		return 0, fmt.Errorf("%w: %d past the end %d", ErrInvalidOffset, to.offset, st.Next)
	}
	return to.offset, nil
}

// moveTo sets the group's offset in partition i: through the partition's
// worker when one runs here, else directly. The caller holds rebalanceMu.
func (g *group) moveTo(ctx context.Context, i int, p partitionLog, off uint64) error {
	var w *worker
	for _, c := range g.members() {
		c.mu.Lock()
		if x := c.workers[i]; x != nil {
			w = x
		}
		c.mu.Unlock()
	}
	if w != nil {
		req := &seekReq{offset: off, done: make(chan error, 1)}
		if self, _ := ctx.Value(workerKey{}).(*worker); self == w {
			// Called from this partition's own handler, which the worker
			// waits for: leave the request (the only one, as the caller
			// holds rebalanceMu) for the worker to apply afterwards.
			select {
			case <-w.seek:
			default:
			}
			w.seek <- req
			return nil
		}
		select {
		case w.seek <- req:
			select {
			case err := <-req.done:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		case <-w.done: // stopped on its own (node closing): write directly
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.m.commitOffset(ctx, p, g.name, off)
}

// applySeek commits req's offset for the worker and answers req. It returns
// the offset to go on from: req's, or cur if the commit failed.
func (w *worker) applySeek(req *seekReq, cur uint64) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := w.store(ctx, req.offset)
	req.done <- err
	if err != nil {
		return cur
	}
	w.committed = req.offset
	w.lastCommit = time.Now()
	return req.offset
}
