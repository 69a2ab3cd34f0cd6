// Command mqcert makes what a cluster's nodes need to prove who they are:
// a cluster CA, a certificate per node naming its NodeID, and a cluster
// secret.
//
//	mqcert ca -dir certs [-name "orders cluster"] [-days 3650]
//	    writes certs/ca.pem (give it to every node) and certs/ca-key.pem
//	    (keep it off the nodes)
//	mqcert node -dir certs -id n1 [-days 365]
//	    signs with certs/ca-key.pem and writes certs/n1.pem and
//	    certs/n1-key.pem (for node n1 only)
//	mqcert secret
//	    prints a new cluster secret: 32 random bytes in hex
//
// A node loads its files with mq.ClusterTLSFiles("certs/ca.pem",
// "certs/n1.pem", "certs/n1-key.pem"). Existing files are never
// overwritten. Exit status 0 on success, 1 on a failure, 2 on bad usage.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/zeze-go/mq"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage:
  mqcert ca -dir DIR [-name NAME] [-days N]   a new cluster CA: DIR/ca.pem, DIR/ca-key.pem
  mqcert node -dir DIR -id ID [-days N]       a node certificate: DIR/ID.pem, DIR/ID-key.pem
  mqcert secret                               a new cluster secret, in hex
`

// errUsage is a mistake in the command line.
var errUsage = errors.New("bad usage")

// run runs the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	err := dispatch(args, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "mqcert: %v\n%s", err, usage)
		return 2
	default:
		fmt.Fprintf(stderr, "mqcert: %v\n", err)
		return 1
	}
}

func dispatch(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no command", errUsage)
	}
	fs := flag.NewFlagSet("mqcert "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "the directory of the CA's and nodes' files")
	days := fs.Int("days", 0, "days of validity (default: 3650 for a CA, 365 for a node)")
	name := fs.String("name", "zeze-mq cluster CA", "the CA's name")
	id := fs.String("id", "", "the node's NodeID")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected %q", errUsage, fs.Arg(0))
	}
	if *days < 0 || *days > 100*365 {
		return fmt.Errorf("%w: -days %d, want 1..36500", errUsage, *days)
	}
	validity := time.Duration(*days) * 24 * time.Hour
	switch args[0] {
	case "ca":
		if *dir == "" {
			return fmt.Errorf("%w: ca needs -dir", errUsage)
		}
		ca, err := mq.NewClusterCA(*name, validity)
		if err != nil {
			return err
		}
		key, err := ca.KeyPEM()
		if err != nil {
			return err
		}
		if err := os.MkdirAll(*dir, 0o700); err != nil {
			return err
		}
		if err := writeNew(filepath.Join(*dir, "ca-key.pem"), key, 0o600); err != nil {
			return err
		}
		if err := writeNew(filepath.Join(*dir, "ca.pem"), ca.CertPEM(), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s and %s\n", filepath.Join(*dir, "ca.pem"), filepath.Join(*dir, "ca-key.pem"))
		return nil
	case "node":
		if *dir == "" || *id == "" {
			return fmt.Errorf("%w: node needs -dir and -id", errUsage)
		}
		certPEM, err := os.ReadFile(filepath.Join(*dir, "ca.pem"))
		if err != nil {
			return err
		}
		keyPEM, err := os.ReadFile(filepath.Join(*dir, "ca-key.pem"))
		if err != nil {
			return err
		}
		ca, err := mq.LoadClusterCA(certPEM, keyPEM)
		if err != nil {
			return err
		}
		cert, key, err := ca.IssueNode(*id, validity)
		if err != nil {
			return err
		}
		certFile, keyFile := filepath.Join(*dir, *id+".pem"), filepath.Join(*dir, *id+"-key.pem")
		if err := writeNew(keyFile, key, 0o600); err != nil {
			return err
		}
		if err := writeNew(certFile, cert, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s and %s\n", certFile, keyFile)
		return nil
	case "secret":
		b := make([]byte, 32)
		_, _ = rand.Read(b) // crypto/rand.Read never fails
		fmt.Fprintln(stdout, hex.EncodeToString(b))
		return nil
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
}

// writeNew writes b to a new file at path, synced; an existing file is an
// error, never overwritten.
func writeNew(path string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
