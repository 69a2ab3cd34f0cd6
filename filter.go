package mq

import (
	"fmt"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/vm"

	"github.com/zeze-go/mq/store"
)

// filter decides which messages reach a consumer's listener. It is built
// once by NewConsumer and read-only afterwards.
type filter struct {
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

// WithTags keeps only the messages that carry at least one of the tags in
// list, written "TagA || TagB" as in RocketMQ; "*" or "" keeps every message.
// Messages filtered out advance the group's offset without reaching
// OnMessage. With WithFilter too, a message must pass both.
func WithTags(list string) ConsumerOption {
	return func(c *consumerConfig) error {
		list = strings.TrimSpace(list)
		if list == "" || list == "*" {
			return nil
		}
		tags := map[string]bool{}
		for _, t := range strings.Split(list, "||") {
			t = strings.TrimSpace(t)
			if t == "" || strings.ContainsAny(t, " \t|") {
				return fmt.Errorf("%w: tag list %q: want \"TagA || TagB\"", ErrInvalidOption, list)
			}
			tags[t] = true
		}
		f := c.editFilter()
		f.tags = tags
		return nil
	}
}

// WithFilter keeps only the messages for which expression is true. The
// expression is in the expr-lang/expr language and sees Tags ([]string),
// Properties (map[string]string; a missing key reads as "") and Key
// (string), for example
//
//	"TagA" in Tags && Properties["region"] == "eu"
//
// It is compiled once, by NewConsumer, which returns an error wrapping
// ErrInvalidOption for an expression that does not compile or is not
// boolean. An expression that fails while it runs on a message (a bad
// conversion of a property, say) counts as false, and the failure is logged.
// Messages filtered out advance the group's offset without reaching
// OnMessage.
func WithFilter(expression string) ConsumerOption {
	return func(c *consumerConfig) error {
		prog, err := expr.Compile(expression, expr.Env(filterEnv{}), expr.AsBool())
		if err != nil {
			return fmt.Errorf("%w: filter %q: %v", ErrInvalidOption, expression, err)
		}
		f := c.editFilter()
		f.prog, f.src = prog, expression
		return nil
	}
}

// editFilter returns a filter of c's own to change.
func (c *consumerConfig) editFilter() *filter {
	f := &filter{}
	if c.filter != nil {
		*f = *c.filter
	}
	c.filter = f
	return f
}

// accept reports whether sm should reach the listener. It runs on the
// worker's own goroutine (it uses w.vm).
func (w *worker) accept(sm *store.Message) bool {
	c := w.c
	if c.parent != nil { // retry topic: only our parent's parked messages
		return sm.Properties[PropRetryGroup] == c.parent.group.name && sm.Properties[PropOriginTopic] == c.parent.topic
	}
	f := c.cfg.filter
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
