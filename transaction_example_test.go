package mq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
)

// A message sent with CommitMessage inside the host's bbolt transaction is
// published when that transaction commits, and never when it rolls back.
func ExampleProducer_CommitMessage() {
	dir, _ := os.MkdirTemp("", "mq-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	db, _ := bolt.Open(filepath.Join(dir, "app.db"), 0o600, nil)
	defer db.Close() // after the node
	host, _ := localtx.NewBolt(db, localtx.BoltOptions{})
	m, _ := mq.Open(filepath.Join(dir, "mq"), mq.WithLocalTx(host))
	defer m.Close()
	m.CreateMQ(ctx, "orders", 1, mq.Options{})
	p, _ := m.NewProducer("orders")

	for _, order := range []string{"order-1", "order-2"} {
		err := host.Run(ctx, func(ctx context.Context) error {
			b, err := host.Tx(ctx).CreateBucketIfNotExists([]byte("orders"))
			if err != nil {
				return err
			}
			if err := b.Put([]byte(order), []byte("placed")); err != nil {
				return err
			}
			if err := p.CommitMessage(ctx, &mq.Message{Body: []byte(order + " placed")}); err != nil {
				return err
			}
			if order == "order-2" {
				return errors.New("out of stock") // rolls back the row and the message
			}
			return nil
		})
		fmt.Println(order, "->", err)
	}

	done := make(chan struct{})
	c, _ := m.NewConsumer("orders", "shipping", mq.ListenerFunc(
		func(ctx context.Context, topic string, msg *mq.Message) error {
			fmt.Printf("received %q\n", msg.Body)
			close(done)
			return nil
		}))
	<-done
	c.Close()
	// Output:
	// order-1 -> <nil>
	// order-2 -> out of stock
	// received "order-1 placed"
}
