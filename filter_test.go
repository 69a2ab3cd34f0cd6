package mq_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// bodies returns the bodies s received, in order.
func (s *sink) bodies() []string {
	var out []string
	for _, m := range s.all() {
		out = append(out, string(m.Body))
	}
	return out
}

// TestConsumer_Filter: tag lists and expressions pass only matching
// messages to OnMessage, and the filtered ones still advance the offset.
func TestConsumer_Filter(t *testing.T) {
	msgs := []*mq.Message{
		{Body: []byte("a-eu"), Tags: []string{"TagA"}, Properties: map[string]string{"region": "eu", "n": "5"}},
		{Body: []byte("b-us"), Tags: []string{"TagB"}, Properties: map[string]string{"region": "us", "n": "x"}},
		{Body: []byte("c"), Tags: []string{"TagC", "TagA"}},
		{Body: []byte("none")},
		{Body: []byte("a-us"), Tags: []string{"TagA"}, Properties: map[string]string{"region": "us"}, Key: "k1"},
	}
	tests := []struct {
		name string
		opts []mq.ConsumerOption
		want []string
	}{
		{"TagList", []mq.ConsumerOption{mq.WithTags("TagB || TagC")}, []string{"b-us", "c"}},
		{"OneTag", []mq.ConsumerOption{mq.WithTags(" TagA ")}, []string{"a-eu", "c", "a-us"}},
		{"AllTags", []mq.ConsumerOption{mq.WithTags("*")}, []string{"a-eu", "b-us", "c", "none", "a-us"}},
		{"Expression", []mq.ConsumerOption{mq.WithFilter(`"TagA" in Tags && Properties["region"] != "us"`)}, []string{"a-eu", "c"}},
		{"MissingPropertyIsEmpty", []mq.ConsumerOption{mq.WithFilter(`Properties.region == ""`)}, []string{"c", "none"}},
		{"Key", []mq.ConsumerOption{mq.WithFilter(`Key startsWith "k"`)}, []string{"a-us"}},
		{"RuntimeErrorIsFalse", []mq.ConsumerOption{mq.WithFilter(`Properties.n != "" && int(Properties.n) > 3`)}, []string{"a-eu"}},
		{"TagsAndExpression", []mq.ConsumerOption{mq.WithTags("TagA"), mq.WithFilter(`Properties.region == "us"`)}, []string{"a-us"}},
		{"KeyParallel", []mq.ConsumerOption{mq.WithFilter(`"TagA" in Tags`), mq.WithKeyParallel(4)}, []string{"a-eu", "c", "a-us"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := openNode(t, "")
			mustCreate(t, m, "t", 1)
			p, _ := m.NewProducer("t")
			for _, msg := range msgs {
				c := *msg
				mustSend(t, p, c.ToPartition(0))
			}
			s := &sink{}
			c := consume(t, m, "t", "g", s, tc.opts...)
			waitFor(t, 5*time.Second, "the matching messages", func() bool { return s.len() >= len(tc.want) })
			// The last message decides the final offset: wait for it to be
			// committed, then a plain consumer of the group gets only what
			// comes next.
			c.Close()
			mustSend(t, p, (&mq.Message{Body: []byte("after")}).ToPartition(0))
			rest := &sink{}
			consume(t, m, "t", "g", rest)
			waitFor(t, 5*time.Second, "the next message", func() bool { return rest.len() >= 1 })
			got := s.bodies()
			if tc.name == "KeyParallel" {
				slices.Sort(got)
				slices.Sort(tc.want)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("delivered %v, want %v", got, tc.want)
			}
			if b := rest.bodies(); !slices.Equal(b, []string{"after"}) {
				t.Errorf("after the filtered consumer the group got %v, want [after]", b)
			}
		})
	}
}

// TestConsumer_FilterErrors: a bad tag list or expression fails NewConsumer.
func TestConsumer_FilterErrors(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "t", 1)
	for name, opt := range map[string]mq.ConsumerOption{
		"Syntax":      mq.WithFilter(`Tags ==`),
		"NotBool":     mq.WithFilter(`Key`),
		"UnknownName": mq.WithFilter(`Region == "eu"`),
		"EmptyTag":    mq.WithTags("TagA ||"),
		"SpaceInTag":  mq.WithTags("Tag A"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := m.NewConsumer("t", "g", &sink{}, opt)
			if !errors.Is(err, mq.ErrInvalidOption) {
				t.Fatalf("NewConsumer = %v, want ErrInvalidOption", err)
			}
			if name == "Syntax" && !strings.Contains(err.Error(), "Tags ==") {
				t.Errorf("error %q does not name the expression", err)
			}
		})
	}
}
