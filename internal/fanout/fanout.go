// Package fanout runs one step per partition side by side: a send to
// several partitions, a transaction committed in each of its partitions.
package fanout

import "sync"

// Each runs fn for every item, in parallel when there are several, and
// returns the first error. It returns when every fn has returned.
func Each[T any](items []T, fn func(T) error) error {
	if len(items) == 1 {
		return fn(items[0])
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, it := range items {
		wg.Go(func() {
			if err := fn(it); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}
