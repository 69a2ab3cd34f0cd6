// Command testsum reads `go test -json` on stdin and prints what a plain
// `go test` prints (the output of failed tests and each package's result
// line), then checks that the tests the CI requires ran: each -require
// pattern matches a test that passed, and no test matching -noskip was
// skipped. It exits 1 when a test failed or a check does not hold.
//
//	go test -json ./... | go run ./.ci/testsum -require 'TestAdapter/postgres$' -noskip 'postgres|mysql'
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

type patterns []*regexp.Regexp

func (p *patterns) String() string { return fmt.Sprint(*p) }
func (p *patterns) Set(s string) error {
	re, err := regexp.Compile(s)
	if err != nil {
		return err
	}
	*p = append(*p, re)
	return nil
}

func main() {
	var require patterns
	var noskip patterns
	flag.Var(&require, "require", "a test matching this pattern must pass (repeatable)")
	flag.Var(&noskip, "noskip", "no test matching this pattern may be skipped (repeatable)")
	flag.Parse()

	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	buffered := map[string][]string{} // package/test -> output lines so far
	recent := map[string][]string{}   // package -> its last lines, whichever test printed them
	shown := map[string]bool{}        // packages a failed test's output was printed for
	var passed, skipped []string
	failed := false
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		var e event
		if err := json.Unmarshal(in.Bytes(), &e); err != nil {
			fmt.Fprintln(out, in.Text()) // the build's own output
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			if e.Test == "" { // the package's own lines: ok, FAIL, build errors
				if !strings.HasPrefix(e.Output, "=== ") && !strings.HasPrefix(e.Output, "--- PASS") && !strings.HasPrefix(e.Output, "PASS\n") {
					fmt.Fprint(out, e.Output)
					out.Flush() // a package's result shows as it comes
				}
				continue
			}
			buffered[key] = append(buffered[key], e.Output)
			r := append(recent[e.Package], e.Output)
			if len(r) > 400 {
				r = r[len(r)-200:]
			}
			recent[e.Package] = r
		case "pass":
			passed = append(passed, e.Test)
			delete(buffered, key)
		case "skip":
			skipped = append(skipped, e.Test)
			delete(buffered, key)
		case "fail":
			failed = true
			if e.Test == "" && !shown[e.Package] {
				// The package failed with no test failing: its binary died
				// (a timeout, a panic); its last lines tell why.
				for _, line := range recent[e.Package] {
					fmt.Fprint(out, line)
				}
			}
			if e.Test != "" {
				shown[e.Package] = true
			}
			for _, line := range buffered[key] {
				if !strings.HasPrefix(line, "=== ") {
					fmt.Fprint(out, line)
				}
			}
			delete(buffered, key)
		}
	}
	// A test that neither passed nor failed: its binary died (a panic, a
	// timeout); what it printed tells why.
	for _, lines := range buffered {
		for _, line := range lines {
			if !strings.HasPrefix(line, "=== ") {
				fmt.Fprint(out, line)
			}
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(out, "testsum:", err)
		failed = true
	}
	for _, re := range require {
		n := 0
		for _, name := range passed {
			if re.MatchString(name) {
				n++
			}
		}
		if n == 0 {
			fmt.Fprintf(out, "testsum: no test matching %q passed\n", re)
			failed = true
		}
	}
	var bad []string
	for _, name := range skipped {
		for _, re := range noskip {
			if re.MatchString(name) {
				bad = append(bad, name)
				break
			}
		}
	}
	sort.Strings(bad)
	for _, name := range bad {
		fmt.Fprintf(out, "testsum: %s was skipped; it must run\n", name)
		failed = true
	}
	fmt.Fprintf(out, "testsum: %d tests passed, %d skipped\n", len(passed), len(skipped))
	if failed {
		out.Flush()
		os.Exit(1)
	}
}
