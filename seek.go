package mq

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/zeze-go/mq/internal/partition"
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

// seekReq is a reset of one partition queued for the partition's worker,
// which applies it before it delivers anything more: when it is between
// messages, or when it ends. done is closed once err is set.
type seekReq struct {
	offset uint64
	done   chan struct{}
	err    error
}

// ResetOffset moves the committed offset of group in topic's partitions to
// to. group is a consumer's OffsetName: the group, or group@instance for a
// broadcasting consumer. It works on a group that never consumed (it then
// starts there) and while the group's consumers run on this node: each
// running partition finishes the message in its handler (a message waiting
// to be retried is dropped from the wait), commits the new offset itself
// and goes on from there, so no message is delivered twice by the reset
// and no older commit overwrites it. A partition moving between consumers
// takes the reset with it.
//
// Messages a Concurrent consumer parked in the group's retry topic are not
// affected.
//
// It returns ErrNoTopic, ErrInvalidGroup, ErrInvalidPartition,
// ErrInvalidOffset, ErrClosed, or ctx's error (a running partition may then
// still move when its handler returns). It waits for the handlers of the
// group on this node that are running. Called from a handler (or with the
// ctx a handler was given), it does not wait for that handler, nor for one
// that is itself inside a call to this package that waits: their
// partitions move when they return, and their own results no longer count
// for the group's offset.
func (m *MQ) ResetOffset(ctx context.Context, topic, group string, to Position) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkOffsetName(group); err != nil {
		return err
	}
	if _, _, err := m.router.partitions(topic); err != nil {
		return err
	}
	g, err := m.groupFor(topic, group)
	if err != nil {
		return err
	}
	r := enter(ctx)
	defer r.leave()
	queued, err := g.queueReset(ctx, to)
	if err != nil {
		return err
	}
	for _, q := range queued {
		ok, err := r.await(ctx, q.w, q.req.done)
		if err != nil {
			return err
		}
		if ok && q.req.err != nil {
			return fmt.Errorf("reset %s/%d for %s: %w", topic, q.w.part, group, q.req.err)
		}
	}
	m.cfg.logger.Info("group offset reset", "topic", topic, "group", group, "to", to.String())
	return nil
}

// queuedReset is a reset handed to a worker.
type queuedReset struct {
	w   *worker
	req *seekReq
}

// queueReset resolves to in every partition it names, then queues each
// offset for the partition's worker on this node, or writes it when there is
// none. It holds rebalanceMu, so no worker starts or ends meanwhile, but
// waits for none.
func (g *group) queueReset(ctx context.Context, to Position) ([]queuedReset, error) {
	g.rebalanceMu.Lock()
	defer g.rebalanceMu.Unlock()
	_, parts, err := g.m.router.partitions(g.topic)
	if err != nil {
		return nil, err
	}
	if to.kind == posOffset && (to.part < 0 || to.part >= len(parts)) {
		return nil, fmt.Errorf("%w: partition %d of %s (0..%d)", ErrInvalidPartition, to.part, g.topic, len(parts)-1)
	}
	offs := map[int]uint64{} // resolved first: a bad position changes nothing
	for i, p := range parts {
		if to.kind == posOffset && i != to.part {
			continue
		}
		off, err := target(p, to)
		if err != nil {
			return nil, fmt.Errorf("reset %s/%d for %s: %w", g.topic, i, g.name, err)
		}
		offs[i] = off
	}
	var queued []queuedReset
	for i, p := range parts {
		off, ok := offs[i]
		if !ok {
			continue
		}
		if w := g.owners[i]; w != nil {
			req := &seekReq{offset: off, done: make(chan struct{})}
			w.seeks = append(w.seeks, req)
			w.resetting.Store(true)
			select {
			case w.wake <- struct{}{}:
			default: // a token is there already
			}
			queued = append(queued, queuedReset{w, req})
			continue
		}
		if err := g.m.commitOffset(ctx, p, g.name, off); err != nil {
			return queued, fmt.Errorf("reset %s/%d for %s: %w", g.topic, i, g.name, err)
		}
	}
	return queued, nil
}

// Seek moves the consumer's offsets (its OffsetName) in its topic to to; see
// ResetOffset. It returns ErrClosed after Close.
func (c *Consumer) Seek(ctx context.Context, to Position) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
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
	if m.closed.Load() {
		return nil, ErrClosed
	}
	return m.groupLocked(topic, name), nil
}

// target resolves to in one partition.
func target(p partition.Partition, to Position) (uint64, error) {
	st := p.Stats()
	switch to.kind {
	case posFirst:
		return st.Low, nil
	case posLast:
		return st.Next, nil
	case posTime:
		off, err := p.SeekTime(partition.UnixNano(to.t))
		return off, translate(err)
	}
	if to.offset > st.Next {
		return 0, fmt.Errorf("%w: %d past the end %d", ErrInvalidOffset, to.offset, st.Next)
	}
	return to.offset, nil
}

// pollSeeks returns the resets queued for w, if any. Only w's run goroutine
// takes them.
func (w *worker) pollSeeks() []*seekReq {
	if len(w.wake) == 0 {
		return nil
	}
	return w.claimSeeks()
}

// claimSeeks takes the resets queued for w (nil: none).
func (w *worker) claimSeeks() []*seekReq {
	g := w.c.group
	g.rebalanceMu.Lock()
	defer g.rebalanceMu.Unlock()
	return w.claimSeeksLocked()
}

// claimSeeksLocked is claimSeeks for a caller holding rebalanceMu.
func (w *worker) claimSeeksLocked() []*seekReq {
	select {
	case <-w.wake:
	default:
	}
	reqs := w.seeks
	w.seeks = nil
	w.resetting.Store(false)
	return reqs
}

// applySeek commits the offset of the last of reqs (the earlier ones were
// overtaken by it) and answers them all. It returns the offset to go on
// from: the new one, or cur if there was none or the commit failed.
func (w *worker) applySeek(reqs []*seekReq, cur uint64) uint64 {
	if len(reqs) == 0 {
		return cur
	}
	off := reqs[len(reqs)-1].offset
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := w.store(ctx, off)
	for _, req := range reqs {
		req.err = err
		close(req.done)
	}
	if err != nil {
		return cur
	}
	w.committed = off
	w.lastCommit = time.Now()
	return off
}
