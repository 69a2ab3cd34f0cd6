package mq_test

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/zeze-go/mq"
)

// ExampleOpen opens a standalone node in a directory and creates a topic.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "mq-example-")
	defer os.RemoveAll(dir)

	m, err := mq.Open(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	if err := m.CreateMQ(context.Background(), "orders", 8, mq.Options{Type: mq.Single}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(m.Topics())
	// Output: map[orders:8]
}

// ExampleProducer_SendMessage sends messages with a key: they go to the
// same partition, one after another.
func ExampleProducer_SendMessage() {
	dir, _ := os.MkdirTemp("", "mq-example-")
	defer os.RemoveAll(dir)
	m, _ := mq.Open(dir)
	defer m.Close()
	ctx := context.Background()
	m.CreateMQ(ctx, "orders", 8, mq.Options{})

	p, _ := m.NewProducer("orders")
	res, err := p.SendMessage(ctx,
		&mq.Message{Key: "user-42", Body: []byte("created")},
		&mq.Message{Key: "user-42", Body: []byte("paid")},
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res[0].Partition == res[1].Partition, res[0].Offset, res[1].Offset)
	// Output: true 0 1
}

// ExampleMQ_NewConsumer consumes a topic as a member of a group.
func ExampleMQ_NewConsumer() {
	dir, _ := os.MkdirTemp("", "mq-example-")
	defer os.RemoveAll(dir)
	m, _ := mq.Open(dir)
	defer m.Close()
	ctx := context.Background()
	m.CreateMQ(ctx, "orders", 1, mq.Options{})
	p, _ := m.NewProducer("orders")
	p.SendMessage(ctx, &mq.Message{Body: []byte("hello")}, &mq.Message{Body: []byte("world")})

	var wg sync.WaitGroup
	wg.Add(2)
	c, _ := m.NewConsumer("orders", "printer", mq.ListenerFunc(
		func(ctx context.Context, topic string, msg *mq.Message) error {
			fmt.Println(topic, msg.Offset, string(msg.Body))
			wg.Done()
			return nil // commits the message; an error would redeliver it
		}))
	wg.Wait()
	c.Close()
	// Output:
	// orders 0 hello
	// orders 1 world
}
