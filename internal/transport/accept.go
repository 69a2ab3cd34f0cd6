package transport

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"
)

// AcceptEach accepts connections from l and hands each to handle, until l
// is closed, ctx ends or handle returns false. An accept error that is
// neither (out of file descriptors and the like) is logged as what and
// retried after a pause that doubles up to a second.
func AcceptEach(ctx context.Context, l net.Listener, log *slog.Logger, what string, handle func(net.Conn) bool) {
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) || errors.Is(err, ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			log.Warn(what, "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		if !handle(c) {
			return
		}
	}
}
