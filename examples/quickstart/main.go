// Quickstart: an embedded queue in a temporary directory. It creates a topic,
// sends keyed messages and prints them as one consumer receives them: the
// messages of each key arrive in the order they were sent.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync"

	"github.com/zeze-go/mq"
)

func main() {
	dir, err := os.MkdirTemp("", "mq-quickstart-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	m, err := mq.Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	ctx := context.Background()
	if err := m.CreateMQ(ctx, "orders", 4, mq.Options{Type: mq.Single}); err != nil {
		log.Fatal(err)
	}
	p, err := m.NewProducer("orders")
	if err != nil {
		log.Fatal(err)
	}
	users := []string{"alice", "bob", "carol"}
	const perUser = 3
	for i := 0; i < perUser; i++ {
		for _, u := range users {
			msg := &mq.Message{Key: u, Body: []byte(fmt.Sprintf("%s: order %d", u, i+1))}
			if _, err := p.SendMessage(ctx, msg); err != nil {
				log.Fatal(err)
			}
		}
	}

	var wg sync.WaitGroup
	wg.Add(len(users) * perUser)
	var mu sync.Mutex
	c, err := m.NewConsumer("orders", "printer", mq.ListenerFunc(
		func(ctx context.Context, topic string, msg *mq.Message) error {
			mu.Lock()
			defer mu.Unlock()
			fmt.Printf("partition %d offset %d  %s\n", msg.PartitionIndex, msg.Offset, msg.Body)
			wg.Done()
			return nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		log.Fatal(err)
	}
}
