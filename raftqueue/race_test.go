//go:build race

package raftqueue

// raceEnabled: the race detector slows the crash tests several fold.
const raceEnabled = true
