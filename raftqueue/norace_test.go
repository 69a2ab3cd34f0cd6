//go:build !race

package raftqueue

const raceEnabled = false
