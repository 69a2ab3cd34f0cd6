package localtx_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// TestSQL_LostCommitOnServer: on a real server, behind a proxy that breaks
// the connection carrying the COMMIT. A COMMIT whose reply is lost after
// the server committed is never taken for a rollback: with a marker, Run
// reads the commit back; without one, it says it cannot tell. A
// connection cut before the COMMIT reached the server is read back as the
// rollback it is.
func TestSQL_LostCommitOnServer(t *testing.T) {
	for _, server := range []string{"postgres", "mysql"} {
		t.Run(server, func(t *testing.T) {
			reply := map[string]string{"postgres": "COMMIT", "mysql": "OK"}[server]
			for _, c := range []struct {
				name      string
				fault     txtest.ProxyFault
				marker    bool
				hooks     events
				unknown   bool // Run's error is ErrCommitUnknown
				committed bool // the server committed
			}{
				{"ReplyDropped", txtest.DropCommitReply, true, events{"commit"}, false, true},
				{"ReplyDroppedNoMarker", txtest.DropCommitReply, false, events{"unknown"}, true, true},
				{"CutBeforeCommit", txtest.CutBeforeCommit, true, events{"rollback"}, false, false},
				{"CutBeforeCommitNoMarker", txtest.CutBeforeCommit, false, events{"unknown"}, true, false},
			} {
				t.Run(c.name, func(t *testing.T) {
					h, px := txtest.ProxiedServer(t, server, filepath.Join(t.TempDir(), "host"))
					// Nothing else commits through this proxy: the fault
					// hits the COMMIT of Run.
					px.Arm(c.fault, "")
					ev, id, err := runFaulty(t, context.Background(), h, c.marker)
					want := []txtest.Cut{{Fault: c.fault}}
					if c.fault == txtest.DropCommitReply {
						want[0].Reply = reply // the server did commit
					}
					if cuts := px.Cuts(); !reflect.DeepEqual(cuts, want) {
						t.Fatalf("proxy cuts %v, want %v", cuts, want)
					}
					switch {
					case c.unknown:
						if !errors.Is(err, localtx.ErrCommitUnknown) || len(wrapped(err)) < 2 {
							t.Errorf("Run = %v, want ErrCommitUnknown with the commit's error", err)
						}
					case c.committed:
						if err != nil {
							t.Errorf("Run = %v, want nil: the marker is there", err)
						}
					default:
						if err == nil || errors.Is(err, localtx.ErrCommitUnknown) {
							t.Errorf("Run = %v, want the commit's error", err)
						}
					}
					if !reflect.DeepEqual(ev, c.hooks) {
						t.Errorf("hooks %v, want %v", ev, c.hooks)
					}
					if _, ok := mustGet(t, h, "k"); ok != c.committed {
						t.Errorf("business row present %v, want %v", ok, c.committed)
					}
					st := localtx.RolledBack
					if c.committed && c.marker {
						st = localtx.Committed
					}
					if got, _, err := h.Store.Check(context.Background(), id); err != nil || got != st {
						t.Errorf("Check = %v, %v; want %v", got, err, st)
					}
				})
			}
		})
	}
}

// wrapped returns the errors err wraps directly.
func wrapped(err error) []error {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		return u.Unwrap()
	case interface{ Unwrap() error }:
		return []error{u.Unwrap()}
	}
	return nil
}
