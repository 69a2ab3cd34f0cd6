package cluster

import (
	"context"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogger bridges raft's hclog.Logger to a *slog.Logger, so raft never
// writes to stderr on its own.
type hclogger struct {
	l    *slog.Logger
	name string
	args []any
}

var _ hclog.Logger = (*hclogger)(nil)

// NewHCLogger returns an hclog.Logger (raft's) that writes to l, as
// component name.
func NewHCLogger(l *slog.Logger, name string) hclog.Logger { return newHCLogger(l, name) }

func newHCLogger(l *slog.Logger, name string) *hclogger {
	return &hclogger{l: l.With("component", name), name: name}
}

// levelTrace is hclog's Trace below slog's Debug.
const levelTrace = slog.LevelDebug - 4

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return levelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (h *hclogger) Log(level hclog.Level, msg string, args ...any) {
	h.l.Log(context.Background(), slogLevel(level), msg, args...)
}
func (h *hclogger) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogger) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogger) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogger) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogger) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogger) enabled(level slog.Level) bool {
	return h.l.Enabled(context.Background(), level)
}
func (h *hclogger) IsTrace() bool { return h.enabled(levelTrace) }
func (h *hclogger) IsDebug() bool { return h.enabled(slog.LevelDebug) }
func (h *hclogger) IsInfo() bool  { return h.enabled(slog.LevelInfo) }
func (h *hclogger) IsWarn() bool  { return h.enabled(slog.LevelWarn) }
func (h *hclogger) IsError() bool { return h.enabled(slog.LevelError) }

func (h *hclogger) ImpliedArgs() []any { return h.args }

func (h *hclogger) With(args ...any) hclog.Logger {
	return &hclogger{l: h.l.With(args...), name: h.name, args: append(append([]any(nil), h.args...), args...)}
}

func (h *hclogger) Name() string { return h.name }

func (h *hclogger) Named(name string) hclog.Logger {
	if h.name != "" {
		name = h.name + "." + name
	}
	return h.ResetNamed(name)
}

func (h *hclogger) ResetNamed(name string) hclog.Logger {
	return &hclogger{l: h.l.With("component", name), name: name, args: h.args}
}

// SetLevel does nothing: the slog handler decides.
func (h *hclogger) SetLevel(hclog.Level) {}

func (h *hclogger) GetLevel() hclog.Level {
	for _, lv := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if h.enabled(slogLevel(lv)) {
			return lv
		}
	}
	return hclog.Off
}

func (h *hclogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hclogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return slogWriter{h}
}

// slogWriter logs each write as one Info record.
type slogWriter struct{ h *hclogger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.h.Info(string(trimNewline(p)))
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}
