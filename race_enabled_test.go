//go:build race

package mq_test

// raceEnabled reports whether the race detector is on: it slows the
// cluster tests enough that they run one at a time (parallelByDefault).
const raceEnabled = true
