package delivery

import (
	"fmt"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/vm"

	"github.com/zeze-go/mq/store"
)

// Filter decides which messages reach a consumer's handler. It is built
// once, before the consumer starts, and read-only afterwards.
type Filter struct {
	tags map[string]bool // nil: any message
	prog *vm.Program     // nil: no expression
	src  string
}

// filterEnv is what a filter expression sees.
type filterEnv struct {
	Tags       []string          `expr:"Tags"`
	Properties map[string]string `expr:"Properties"`
	Key        string            `expr:"Key"`
}

// WithTags returns f, or a new filter if f is nil, keeping only the messages
// that carry at least one tag of list, written "TagA || TagB"; "*" or ""
// keeps every message.
func (f *Filter) WithTags(list string) (*Filter, error) {
	list = strings.TrimSpace(list)
	if list == "" || list == "*" {
		return f, nil
	}
	tags := map[string]bool{}
	for _, t := range strings.Split(list, "||") {
		t = strings.TrimSpace(t)
		if t == "" || strings.ContainsAny(t, " \t|") {
			return nil, fmt.Errorf("tag list %q: want \"TagA || TagB\"", list)
		}
		tags[t] = true
	}
	g := f.clone()
	g.tags = tags
	return g, nil
}

// WithExpression returns f, or a new filter if f is nil, keeping only the
// messages for which expression, in the expr-lang/expr language, is true.
func (f *Filter) WithExpression(expression string) (*Filter, error) {
	prog, err := expr.Compile(expression, expr.Env(filterEnv{}), expr.AsBool())
	if err != nil {
		return nil, fmt.Errorf("filter %q: %v", expression, err)
	}
	g := f.clone()
	g.prog, g.src = prog, expression
	return g, nil
}

func (f *Filter) clone() *Filter {
	g := &Filter{}
	if f != nil {
		*g = *f
	}
	return g
}

// accept reports whether sm should reach the handler. It runs on the
// worker's own goroutine, since it uses w.vm.
func (w *worker) accept(sm *store.Message) bool {
	c := w.c
	if c.parent != nil { // retry topic: only our parent's parked messages
		return sm.Properties[PropRetryGroup] == c.parent.group.name && sm.Properties[PropOriginTopic] == c.parent.topic
	}
	f := c.cfg.Filter
	if f == nil {
		return true
	}
	if f.tags != nil {
		found := false
		for _, t := range sm.Tags {
			if f.tags[t] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if f.prog == nil {
		return true
	}
	out, err := w.vm.Run(f.prog, filterEnv{Tags: sm.Tags, Properties: sm.Properties, Key: sm.Key})
	if err != nil {
		w.logger().Warn("filter failed on a message; skipping it", "offset", sm.Offset, "filter", f.src, "err", err)
		return false
	}
	ok, _ := out.(bool)
	return ok
}
