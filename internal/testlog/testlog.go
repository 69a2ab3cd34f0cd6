// Package testlog is a slog handler for tests that check what was logged.
// Only tests import it.
package testlog

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// Lines keeps every record as one line: the message, then " key=value" per
// attribute. It is safe for concurrent use.
type Lines struct {
	mu    sync.Mutex
	lines []string
}

// Enabled implements slog.Handler: every level.
func (l *Lines) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs implements slog.Handler; the attributes are dropped.
func (l *Lines) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler.
func (l *Lines) WithGroup(string) slog.Handler { return l }

// Handle implements slog.Handler.
func (l *Lines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, b.String())
	return nil
}

// Matching returns the lines that hold every part.
func (l *Lines) Matching(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			out = append(out, line)
		}
	}
	return out
}

// AwaitMatching polls Matching until it returns a line or within has
// passed, and returns its last result: nil if no line came.
func (l *Lines) AwaitMatching(within time.Duration, parts ...string) []string {
	deadline := time.Now().Add(within)
	for {
		if m := l.Matching(parts...); len(m) > 0 || time.Now().After(deadline) {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// String is every line, one per line.
func (l *Lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// Reset forgets the lines kept so far.
func (l *Lines) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = nil
}
