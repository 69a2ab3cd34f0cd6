package mq_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// timeCase is a time at or past an end of what int64 Unix nanoseconds hold
// (1677-09-21T00:12:43.145224192Z to 2262-04-11T23:47:16.854775807Z) and
// what a message carrying it as DeliverAt or Timestamp does.
type timeCase struct {
	name      string
	at        time.Time
	deliverAt string // "now", "later" or "refused"
	timestamp string // "kept" or "refused"
}

func timeCases() []timeCase {
	year := func(y int) time.Time { return time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC) }
	minNano, maxNano := time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)
	return []timeCase{
		{"Year1000", year(1000), "now", "refused"},
		{"Year1677", year(1677), "now", "refused"},
		{"BeforeMinNano", minNano.Add(-time.Nanosecond), "now", "refused"},
		{"MinNano", minNano, "now", "kept"},
		{"Year1678", year(1678), "now", "kept"},
		{"Year1969", year(1969), "now", "kept"},
		{"Year2262", year(2262), "later", "kept"},
		{"MaxNano", maxNano, "later", "kept"},
		{"AfterMaxNano", maxNano.Add(time.Nanosecond), "refused", "refused"},
		{"Year2263", year(2263), "refused", "refused"},
		{"Year10000", year(10000), "refused", "refused"},
	}
}

// TestProducer_SendMessageTimes sends DeliverAt and Timestamp across both
// ends of the int64 nanosecond range: a DeliverAt in the past, however far,
// is delivered at once; one past the range is refused before anything is
// stored, as is a Timestamp outside it.
func TestProducer_SendMessageTimes(t *testing.T) {
	m := openNode(t, "")
	ctx := context.Background()
	for _, tc := range timeCases() {
		t.Run(tc.name, func(t *testing.T) {
			mustCreate(t, m, tc.name, 1)
			p, err := m.NewProducer(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			t.Run("DeliverAt", func(t *testing.T) {
				res := checkTimeSend(t, p, tc.deliverAt, &mq.Message{Body: []byte("x"), DeliverAt: tc.at})
				if tc.deliverAt == "now" {
					got, err := m.ReadMessage(ctx, tc.name, 0, res.Offset)
					if err != nil {
						t.Fatal(err)
					}
					// The store keeps what it can represent; a time before
					// that reads back as no delay at all.
					if !got.DeliverAt.Equal(tc.at) && !got.DeliverAt.IsZero() {
						t.Errorf("DeliverAt read back as %v, want %v or zero", got.DeliverAt, tc.at)
					}
				}
			})
			t.Run("Timestamp", func(t *testing.T) {
				want := map[string]string{"kept": "now", "refused": "refused"}[tc.timestamp]
				res := checkTimeSend(t, p, want, &mq.Message{Body: []byte("x"), Timestamp: tc.at})
				if want == "now" {
					got, err := m.ReadMessage(ctx, tc.name, 0, res.Offset)
					if err != nil {
						t.Fatal(err)
					}
					if !got.Timestamp.Equal(tc.at) {
						t.Errorf("Timestamp read back as %v, want %v", got.Timestamp, tc.at)
					}
				}
			})
		})
	}
}

// checkTimeSend sends msg and checks the outcome against want ("now",
// "later" or "refused"). A refused send must leave msg untouched and store
// nothing: probes sent before and after it to the topic's only partition
// take consecutive offsets.
func checkTimeSend(t *testing.T, p *mq.Producer, want string, msg *mq.Message) mq.SendResult {
	t.Helper()
	ctx := context.Background()
	probe := func() int64 {
		t.Helper()
		r, err := p.SendMessage(ctx, &mq.Message{Body: []byte("probe")})
		if err != nil {
			t.Fatal(err)
		}
		return r[0].Offset
	}
	first := probe()
	res, err := p.SendMessage(ctx, msg)
	switch want {
	case "now":
		if err != nil || res[0].Delayed || res[0].Offset < 0 {
			t.Fatalf("SendMessage = %+v, %v; want delivered at once", res, err)
		}
	case "later":
		if err != nil || !res[0].Delayed {
			t.Fatalf("SendMessage = %+v, %v; want held back", res, err)
		}
	case "refused":
		if !errors.Is(err, mq.ErrInvalidMessage) {
			t.Fatalf("SendMessage = %+v, %v; want ErrInvalidMessage", res, err)
		}
		if msg.ID != "" || msg.Topic != "" {
			t.Errorf("a refused message was routed: ID %q, Topic %q", msg.ID, msg.Topic)
		}
		if next := probe(); next != first+1 {
			t.Errorf("probes around a refused send at offsets %d and %d: it was stored", first, next)
		}
	}
	return res[0]
}

// TestProducer_TxTimes: PrepareMessage and CommitMessage apply the same
// checks of DeliverAt and Timestamp as SendMessage.
func TestProducer_TxTimes(t *testing.T) {
	e := newTxEnv(t, "bolt")
	ctx := context.Background()
	var now, later []string
	err := e.h.Run(ctx, func(ctx context.Context) error {
		for _, tc := range timeCases() {
			for _, send := range []struct {
				name string
				fn   func(context.Context, ...*mq.Message) error
			}{{"Prepare", e.p.PrepareMessage}, {"Commit", e.p.CommitMessage}} {
				id := send.name + tc.name
				err := send.fn(ctx, &mq.Message{ID: id + "-d", Body: []byte("x"), DeliverAt: tc.at})
				switch tc.deliverAt {
				case "refused":
					if !errors.Is(err, mq.ErrInvalidMessage) {
						t.Errorf("%s with DeliverAt %v = %v, want ErrInvalidMessage", send.name, tc.at, err)
					}
				case "now":
					now = append(now, id+"-d")
				case "later":
					later = append(later, id+"-d")
				}
				if tc.deliverAt != "refused" && err != nil {
					t.Errorf("%s with DeliverAt %v: %v", send.name, tc.at, err)
				}
				err = send.fn(ctx, &mq.Message{ID: id + "-t", Body: []byte("x"), Timestamp: tc.at})
				if tc.timestamp == "refused" {
					if !errors.Is(err, mq.ErrInvalidMessage) {
						t.Errorf("%s with Timestamp %v = %v, want ErrInvalidMessage", send.name, tc.at, err)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s with Timestamp %v: %v", send.name, tc.at, err)
				}
				now = append(now, id+"-t")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitSeen(t, e.col, now...)
	fence(t, e.m, e.col, "orders")
	for _, id := range later {
		if n := e.col.count(id); n != 0 {
			t.Errorf("%s, due after 2261, was delivered", id)
		}
	}
	for _, id := range now {
		if n := e.col.count(id); n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
}

// TestProducer_SendMessageSize checks MaxMessageBytes at and one past the
// limit, counting what its doc says (body, key, tags and properties), and
// that a resend of the same struct, which now carries its generated ID, is
// judged like the first send. The ID has a bound of its own: it keys the
// dedup index, and before MaxIDBytes a 40 000-byte ID was acknowledged and
// then failed the partition's bbolt write ("key too large").
func TestProducer_SendMessageSize(t *testing.T) {
	const limit = 1024
	m := openNode(t, "", mq.WithMaxMessageBytes(limit))
	mustCreate(t, m, "t", 1)
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// mixed is n bytes spread over key, tags, properties and body.
	mixed := func(n int) *mq.Message {
		return &mq.Message{Key: "kk", Tags: []string{"t1", "t2"}, Properties: map[string]string{"p": "vv"},
			Body: make([]byte, n-2-4-3)}
	}
	cases := []struct {
		name string
		msg  *mq.Message
		want error
	}{
		{"BodyAtLimit", &mq.Message{Body: make([]byte, limit)}, nil},
		{"BodyOnePast", &mq.Message{Body: make([]byte, limit+1)}, mq.ErrMessageTooLarge},
		{"MixedAtLimit", mixed(limit), nil},
		{"MixedOnePast", mixed(limit + 1), mq.ErrMessageTooLarge},
		{"OwnIDAtLimit", &mq.Message{ID: "my-own-id", Body: make([]byte, limit)}, nil},
		{"LongIDAtLimit", &mq.Message{ID: strings.Repeat("i", mq.MaxIDBytes), Body: make([]byte, limit)}, nil},
		{"IDOnePast", &mq.Message{ID: strings.Repeat("i", mq.MaxIDBytes+1)}, mq.ErrInvalidMessage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := p.SendMessage(ctx, tc.msg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("SendMessage = %v, want %v", err, tc.want)
			}
			if tc.want != nil {
				return
			}
			// The same struct again: the same verdict, and the dedup index
			// finds the first copy.
			again, err := p.SendMessage(ctx, tc.msg)
			if err != nil {
				t.Fatalf("resend of the same struct: %v", err)
			}
			if !again[0].Duplicate || again[0].Offset != res[0].Offset {
				t.Fatalf("resend = %+v, first %+v; want the first copy", again[0], res[0])
			}
		})
	}
}
