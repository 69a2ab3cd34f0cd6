package txn

import (
	"context"
	"time"

	"github.com/zeze-go/mq/localtx"
)

type forgetReq struct {
	store localtx.Store
	txid  string
	at    time.Time // when the decision was acknowledged
}

// forgetLater queues the clean-up of txid's marker and outbox rows, once
// the queue's decision is durable. When the queue is full the marker stays:
// the next sweep finds the transaction decided and forgets it then.
func (n *Node) forgetLater(s localtx.Store, txid string) {
	select {
	case n.forgets <- forgetReq{store: s, txid: txid, at: time.Now()}:
	default:
	}
}

// forgetter cleans markers in batches: one host transaction for everything
// queued within forgetLinger, so the clean-up adds little to each
// transaction's cost. With a SyncInterval a decision is acknowledged
// before it is on disk, so its marker is kept two sync intervals longer: a
// power loss must not take the decision while the marker is gone.
func (n *Node) forgetter(ctx context.Context) {
	const (
		forgetLinger = 50 * time.Millisecond
		forgetBatch  = 1024
	)
	hold := 2 * n.cfg.SyncInterval
	linger := max(forgetLinger, hold)
	var pending []forgetReq
	// flush forgets what was queued at least hold ago and keeps the rest.
	flush := func(ctx context.Context) {
		cutoff := time.Now().Add(-hold)
		ready := map[localtx.Store][]string{}
		kept := pending[:0]
		for _, r := range pending {
			if r.at.After(cutoff) {
				kept = append(kept, r)
				continue
			}
			ready[r.store] = append(ready[r.store], r.txid)
		}
		pending = kept
		for s, ids := range ready {
			stores := []localtx.Store{s}
			if s == nil { // a transaction that named no store: try them all
				stores = n.storeList()
			}
			forgot := true
			for _, st := range stores {
				if err := st.Forget(ctx, ids); err != nil {
					n.cfg.Logger.Warn("cannot forget transaction markers; the sweep will", "err", err)
					forgot = false
				}
			}
			if forgot {
				n.cfg.Prune.release(ids)
			}
		}
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	armed := false
	for {
		select {
		case r := <-n.forgets:
			pending = append(pending, r)
			if len(pending) >= forgetBatch && hold == 0 {
				flush(ctx)
			}
		case <-timer.C:
			armed = false
			flush(ctx)
		case <-ctx.Done():
			for {
				select {
				case r := <-n.forgets:
					pending = append(pending, r)
					continue
				default:
				}
				break
			}
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			flush(fctx) // what is not yet durable stays for the next start's sweep
			cancel()
			return
		}
		if len(pending) > 0 && !armed {
			timer.Reset(linger)
			armed = true
		}
	}
}
