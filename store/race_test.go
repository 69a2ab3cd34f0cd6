//go:build race

package store_test

// raceEnabled: the race detector slows the crash simulation tenfold; CI
// runs the thousands of schedules without it.
const raceEnabled = true
