package store

// SetWALSegmentSize sets the size at which w starts a new segment. Call it
// before the first append.
func SetWALSegmentSize(w *WAL, n int64) { w.segSize = n }

const WALStallEnv = walStallEnv
