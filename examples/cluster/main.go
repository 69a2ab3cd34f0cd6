// Cluster: three nodes of one cluster, each in its own process on
// 127.0.0.1, with a node killed by SIGKILL and restarted while messages
// flow.
//
//	go run ./examples/cluster          # a Single topic
//	go run ./examples/cluster -raft3   # a Raft3 topic, its busiest leader killed
//
// The launcher, this program without ZEZE_EXAMPLE_ROLE, starts node n1,
// which bootstraps the cluster, and n2, which joins it; n1 creates the topic,
// so its partitions are placed on n1 and n2. Then n3 joins: it holds no
// partition, since placement happens when a topic is created. n1 produces;
// n2 and n3 consume as one group, which divides the partitions between
// them. The launcher kills n3 with SIGKILL while messages flow: once its
// session expires, n2 takes over n3's partitions, and the producer goes on
// sending, since every partition lives on a node that stays up: a Single
// partition is unavailable while its node is down. n3 is restarted on its
// data directory, rejoins with the same node id and takes a share again.
// At the end the launcher checks that every message the producer had
// acknowledged was consumed at least once, and prints a summary.
//
// With -raft3 the topic is Raft3: its four partitions share a raft group,
// within the default PartitionsPerRaftGroup, with a replica on every node.
// The node leading fewest partitions produces and consumes; the busiest
// leader of the other two is killed with SIGKILL; the two left elect new
// leaders within an election timeout and the flow goes on; the killed node
// restarts on its data and rejoins its groups. Nothing acknowledged is
// lost.
//
// The nodes are this same binary run again with ZEZE_EXAMPLE_ROLE=node.
// They take commands from the launcher on their stdin and send it events,
// one per line, on their stdout, and exit when their stdin closes, so none
// outlives it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"
)

// roleEnv selects a node process's role; the launcher runs without it.
const roleEnv = "ZEZE_EXAMPLE_ROLE"

func main() {
	if os.Getenv(roleEnv) != "" {
		os.Exit(nodeMain())
	}
	raft3 := flag.Bool("raft3", false, "a Raft3 topic, its busiest leader killed")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, *raft3); err != nil {
		fmt.Fprintln(os.Stderr, "cluster example:", err)
		stop()
		cancel()
		os.Exit(1)
	}
}
