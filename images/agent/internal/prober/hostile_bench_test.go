// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
)

// hostileServerEnv names the hostile case a re-executed test binary serves (see TestMain).
const hostileServerEnv = "SWH_PROBER_HOSTILE_SERVER"

// serveHostileProcess is the test binary as a hostile server in its own process: it listens
// on loopback, prints the address, serves the case until its standard input closes (so it
// never outlives the benchmark that started it) and returns the exit code.
func serveHostileProcess(name string) int {
	tc, ok := hostileCases()[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "no hostile case %q\n", name)
		return 2
	}
	h, err := startHostile(tc.script)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(h.l.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	h.close()
	return 0
}

// startHostileProcess runs the case's server in a child process and returns its port.
func startHostileProcess(b *testing.B, name string) int32 {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), hostileServerEnv+"="+name)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				b.Errorf("hostile server %q: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill() // Only the process this benchmark started.
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("hostile server %q did not say its address: %v", name, err)
	}
	var port int32
	if _, err := fmt.Sscanf(strings.TrimSpace(line[strings.LastIndex(line, ":")+1:]), "%d", &port); err != nil {
		b.Fatalf("hostile server %q address %q: %v", name, line, err)
	}
	return port
}

// BenchmarkHostile measures what one probe against a hostile server allocates (B/op), the
// server in another process so that only the prober's allocations count. The slow server is
// left out: it costs time (the deadline), not memory. Results are in development/BENCHMARKS.md.
func BenchmarkHostile(b *testing.B) {
	cases := hostileCases()
	for _, name := range []string{
		"an HTTP header line that never ends",
		"100 000 HTTP headers",
		"a PostgreSQL message that claims a gigabyte",
		"a PostgreSQL server that sends notices without end",
		"a TLS peer that streams a handshake message claiming 16 MiB",
		"a real TLS server whose certificate chain carries 200 KiB",
	} {
		tc := cases[name]
		b.Run(strings.ReplaceAll(name, " ", "_"), func(b *testing.B) {
			port := startHostileProcess(b, name)
			p := prober.New(prober.Options{})
			probe := tc.probe()
			b.ReportAllocs()
			for b.Loop() {
				res, err := p.Probe(b.Context(), probe, "ns", "127.0.0.1", port)
				if err != nil || res.Reason != tc.reason {
					b.Fatalf("probe: %+v %v", res, err)
				}
			}
		})
	}
}
