package mq_test

import (
	"flag"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

// defaultParallel is how many tests marked parallelByDefault run at once
// in the default run, unless -test.parallel says otherwise: they spend
// their time waiting out session, election and follower timeouts (four of
// them keep about one core busy), and go test's default of GOMAXPROCS (two
// here) would leave most of that time idle.
const defaultParallel = 4

// TestMain checks that no test leaves a goroutine behind. It is the only
// TestMain of package mq_test: tests that need set-up of their own (child
// processes of the crash tests) do it in their own test function.
func TestMain(m *testing.M) {
	flag.Parse()
	if !fullRun() && !raceEnabled && !flagGiven("test.parallel") {
		flag.Set("test.parallel", strconv.Itoa(defaultParallel))
	}
	// A waiter of a raft future that hashicorp/raft v1.7.3 never answers
	// (cluster.Meta.awaitWaiters) outlives the Close that gave it up.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/zeze-go/mq/internal/cluster.(*Meta).wait.func1"))
}

// flagGiven reports whether the command line set flag name.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
