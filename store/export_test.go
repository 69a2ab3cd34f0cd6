package store

// Commits returns how many bbolt transactions p committed and how many gens
// (batches with effects) it built.
func Commits(p *Partition) (commits, gens uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.commits, p.batches
}
