package testlog

import (
	"bytes"
	"runtime"
	"strings"
)

// Goroutines returns the stacks of the process's goroutines for which keep
// is true, separated by blank lines: the few a hang's report needs out of a
// whole dump. Each stack is as runtime.Stack prints it, its first line
// "goroutine N [state, minutes]:".
func Goroutines(keep func(stack string) bool) string {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if s := string(g); keep(s) {
			out = append(out, s)
		}
	}
	return strings.Join(out, "\n\n")
}

// BlockedMinutes is a keep for Goroutines: the goroutines blocked for a
// minute or more.
func BlockedMinutes(stack string) bool {
	first, _, _ := strings.Cut(stack, "\n")
	return strings.Contains(first, " minutes]")
}
