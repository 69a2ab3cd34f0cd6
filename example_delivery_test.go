package mq_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/zeze-go/mq"
)

// ExampleMQ_RedriveDeadLetters sends a message that fails to the group's
// dead-letter topic, reads it there, and re-drives it to its topic once the
// handler is fixed.
func ExampleMQ_RedriveDeadLetters() {
	dir, _ := os.MkdirTemp("", "mq-example-")
	defer os.RemoveAll(dir)
	m, _ := mq.Open(dir)
	defer m.Close()
	ctx := context.Background()
	m.CreateMQ(ctx, "orders", 1, mq.Options{})
	p, _ := m.NewProducer("orders")
	p.SendMessage(ctx, &mq.Message{Body: []byte("order-1")})

	fixed := make(chan bool, 1)
	fixed <- false
	handled := make(chan string)
	billing, _ := m.NewConsumer("orders", "billing", mq.ListenerFunc(
		func(ctx context.Context, topic string, msg *mq.Message) error {
			ok := <-fixed
			fixed <- ok
			if !ok {
				return errors.New("no price")
			}
			handled <- fmt.Sprintf("%s %s #%d", topic, msg.Body, msg.ReconsumeTimes)
			return nil
		}), mq.WithMaxReconsumeTimes(1), mq.WithRetryLadder(0))
	defer billing.Close()

	dead := make(chan *mq.Message)
	ops, _ := m.NewConsumer(mq.DeadLetterTopic("billing"), "ops", mq.ListenerFunc(
		func(ctx context.Context, topic string, msg *mq.Message) error {
			dead <- msg
			return nil
		}))
	defer ops.Close()
	d := <-dead
	fmt.Println(d.Topic, string(d.Body), d.Properties[mq.PropReconsumeTimes], d.Properties[mq.PropOriginTopic], d.Properties[mq.PropLastError])

	<-fixed
	fixed <- true
	n, err := m.RedriveDeadLetters(ctx, "billing")
	fmt.Println(n, err)
	fmt.Println(<-handled)
	// Output:
	// %DLQ%billing order-1 2 orders no price
	// 1 <nil>
	// orders order-1 #0
}

// ExampleWithFilter subscribes to the messages of one region only; the
// others advance the group's offset without reaching the listener.
func ExampleWithFilter() {
	dir, _ := os.MkdirTemp("", "mq-example-")
	defer os.RemoveAll(dir)
	m, _ := mq.Open(dir)
	defer m.Close()
	ctx := context.Background()
	m.CreateMQ(ctx, "orders", 1, mq.Options{})
	p, _ := m.NewProducer("orders")
	for _, region := range []string{"eu", "us", "eu"} {
		p.SendMessage(ctx, &mq.Message{Tags: []string{"created"}, Properties: map[string]string{"region": region}, Body: []byte(region)})
	}

	got := make(chan *mq.Message)
	c, err := m.NewConsumer("orders", "eu-billing", mq.ListenerFunc(
		func(ctx context.Context, topic string, msg *mq.Message) error {
			got <- msg
			return nil
		}), mq.WithFilter(`"created" in Tags && Properties.region == "eu"`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	for range 2 {
		msg := <-got
		fmt.Println(msg.Offset, string(msg.Body))
	}
	// Output:
	// 0 eu
	// 2 eu
}

// ExampleConsumer_Seek replays a topic from the start for a group that has
// consumed it.
func ExampleConsumer_Seek() {
	dir, _ := os.MkdirTemp("", "mq-example-")
	defer os.RemoveAll(dir)
	m, _ := mq.Open(dir)
	defer m.Close()
	ctx := context.Background()
	m.CreateMQ(ctx, "orders", 1, mq.Options{})
	p, _ := m.NewProducer("orders")
	p.SendMessage(ctx, &mq.Message{Body: []byte("a")}, &mq.Message{Body: []byte("b")})

	got := make(chan string)
	c, _ := m.NewConsumer("orders", "audit", mq.ListenerFunc(
		func(ctx context.Context, topic string, msg *mq.Message) error {
			got <- string(msg.Body)
			return nil
		}))
	defer c.Close()
	fmt.Println(<-got, <-got)
	if err := c.Seek(ctx, mq.SeekFirst()); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-got, <-got)
	// Output:
	// a b
	// a b
}
