// Transaction: money transfers between two accounts kept in the host's own
// bbolt DB, each announced by a message sent in the same local transaction.
// One transfer would overdraw its account: it fails after its message was
// sent, the local transaction rolls back, and the message is never
// delivered. The consumer prints the committed transfers only.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
)

var (
	accounts        = []byte("accounts")
	errInsufficient = errors.New("insufficient funds")
)

type transfer struct {
	from, to string
	amount   uint64
}

func main() {
	dir, err := os.MkdirTemp("", "mq-transaction-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	// The host's own database, with two accounts.
	db, err := bolt.Open(filepath.Join(dir, "bank.db"), 0o600, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(accounts)
		if err != nil {
			return err
		}
		for name, balance := range map[string]uint64{"alice": 100, "bob": 50} {
			if err := b.Put([]byte(name), binary.BigEndian.AppendUint64(nil, balance)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	// The queue, bound to the host database for check-back and recovery.
	host, err := localtx.NewBolt(db, localtx.BoltOptions{})
	if err != nil {
		log.Fatal(err)
	}
	m, err := mq.Open(filepath.Join(dir, "mq"), mq.WithLocalTx(host))
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	if err := m.CreateMQ(ctx, "transfers", 1, mq.Options{Type: mq.Single}); err != nil {
		log.Fatal(err)
	}
	p, err := m.NewProducer("transfers")
	if err != nil {
		log.Fatal(err)
	}

	transfers := []transfer{{"alice", "bob", 30}, {"bob", "alice", 500}, {"bob", "alice", 10}}
	committed := 0
	for i, tr := range transfers {
		err := host.Run(ctx, func(ctx context.Context) error {
			b := host.Tx(ctx).Bucket(accounts)
			from, to := balance(b, tr.from), balance(b, tr.to)
			msg := &mq.Message{Key: tr.from, Body: []byte(fmt.Sprintf("transfer %d: %s -> %s %d", i+1, tr.from, tr.to, tr.amount))}
			// Sent inside the transaction: published only if it commits.
			if err := p.CommitMessage(ctx, msg); err != nil {
				return err
			}
			if from < tr.amount {
				return fmt.Errorf("transfer %d: %s has %d: %w", i+1, tr.from, from, errInsufficient)
			}
			if err := b.Put([]byte(tr.from), binary.BigEndian.AppendUint64(nil, from-tr.amount)); err != nil {
				return err
			}
			return b.Put([]byte(tr.to), binary.BigEndian.AppendUint64(nil, to+tr.amount))
		})
		switch {
		case err == nil:
			committed++
			fmt.Printf("transfer %d committed\n", i+1)
		case errors.Is(err, errInsufficient):
			fmt.Printf("transfer %d rolled back: %v\n", i+1, err)
		default:
			log.Fatal(err)
		}
	}

	var wg sync.WaitGroup
	wg.Add(committed)
	c, err := m.NewConsumer("transfers", "ledger", mq.ListenerFunc(
		func(ctx context.Context, topic string, msg *mq.Message) error {
			fmt.Printf("delivered: %s\n", msg.Body)
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
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(accounts)
		fmt.Printf("balances: alice %d, bob %d\n", balance(b, "alice"), balance(b, "bob"))
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

func balance(b *bolt.Bucket, name string) uint64 {
	v := b.Get([]byte(name))
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}
