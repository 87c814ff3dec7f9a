// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command server is the target of the probe capacity benchmark (bench/capacity/run.sh): TCP
// listeners that accept and close, and HTTP listeners that answer 200 "ok", on a set of
// loopback addresses, in a process of its own so that the prober's CPU and memory are measured
// alone. Many targets share each listener (the open-file limit is 20000).
//
// It prints one JSON line {"tcp": ["127.0.1.1:port", ...], "http": [...]} once every listener is
// up, then serves until its standard input closes or it gets SIGTERM/SIGINT.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	addrs := flag.Int("addresses", 50, "loopback addresses to listen on (127.0.1.1 upward), each with one TCP and one HTTP listener")
	flag.Parse()
	if err := run(*addrs); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

func run(n int) error {
	if n < 1 || n > 250 {
		return fmt.Errorf("--addresses %d: want 1 to 250", n)
	}
	out := map[string][]string{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	for i := 1; i <= n; i++ {
		host := fmt.Sprintf("127.0.1.%d", i)
		tl, err := net.Listen("tcp4", host+":0")
		if err != nil {
			return fmt.Errorf("listening for TCP on %s: %w", host, err)
		}
		go acceptAndClose(tl)
		hl, err := net.Listen("tcp4", host+":0")
		if err != nil {
			return fmt.Errorf("listening for HTTP on %s: %w", host, err)
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(hl) }()
		out["tcp"] = append(out["tcp"], tl.Addr().String())
		out["http"] = append(out["http"], hl.Addr().String())
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return fmt.Errorf("writing the addresses: %w", err)
	}
	stdin := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdin)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stdin:
	case <-sig:
	}
	return nil
}

func acceptAndClose(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_ = c.Close()
	}
}
