package store

// Commits returns how many bbolt transactions p committed and how many gens
// (batches with effects) it built.
func Commits(p *Partition) (commits, gens uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.commits, p.batches
}

// HalfRecords calls fn with each record of the half transaction value v.
func HalfRecords(v []byte, fn func(rec []byte)) {
	h, err := decodeHalf(v)
	if err != nil {
		panic(err)
	}
	for _, r := range h.Records {
		fn(r)
	}
}
