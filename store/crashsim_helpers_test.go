package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/zeze-go/mq/store"
)

// simReference applies cmds one at a time to a partition no crash touches
// and returns each command's result and error, and the dumps after the
// prefixes of from..len(cmds) commands: dumps[k-from] is the state after
// cmds[:k].
func simReference(dir string, cmds []*store.Command, from int) (res []store.Result, errs []error, dumps []string, err error) {
	p, err := store.Open(filepath.Join(dir, "ref.db"), store.Options{})
	if err != nil {
		return nil, nil, nil, err
	}
	defer p.Close()
	for k := 0; ; k++ {
		if k >= from {
			d, err := store.Dump(p)
			if err != nil {
				return nil, nil, nil, err
			}
			dumps = append(dumps, d)
		}
		if k == len(cmds) {
			return res, errs, dumps, nil
		}
		rs, es, err := p.ApplyBatch(context.Background(), cmds[k:k+1])
		if err != nil {
			return nil, nil, nil, err
		}
		res, errs = append(res, rs[0]), append(errs, es[0])
	}
}

// dumpDiff lists the lines of want missing from got (-) and those of got
// not in want (+), each clipped.
func dumpDiff(want, got string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for _, side := range []struct {
		sign      string
		from, not map[string]bool
		order     string
	}{{"-", w, g, want}, {"+", g, w, got}} {
		for _, l := range strings.Split(side.order, "\n") {
			if !side.not[l] {
				if len(l) > 160 {
					l = l[:160] + "..."
				}
				fmt.Fprintf(&b, "%s %s\n", side.sign, l)
			}
		}
	}
	return b.String()
}
