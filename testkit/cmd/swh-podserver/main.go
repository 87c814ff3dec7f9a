// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command swh-podserver is the test server of the pods on real test nodes (testkit/realnode),
// packed into a local OCI image. It answers HTTP on every port of -listen with status 200, the
// header X-Pod and the body "namespace/name" (POD_NAMESPACE, POD_NAME from the downward API), as
// the harness's in-process servers do. GET /ready answers 200 while the server is ready and 503
// after POST /control/unready (POST /control/ready undoes it): a test makes the kubelet's
// readiness probe fail while every other path, and so the product's per-port probe, still
// passes. POST /control/exit makes the process exit with status 3 (a crash: the kubelet
// restarts the container in the same pod). On SIGTERM it waits -term-delay, then closes its listeners and exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", ":8080", "comma-separated listen addresses")
	termDelay := flag.Duration("term-delay", 0, "how long to keep serving after SIGTERM")
	flag.Parse()
	pod := os.Getenv("POD_NAMESPACE") + "/" + os.Getenv("POD_NAME")
	var unready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if unready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		reply(w, pod)
	})
	mux.HandleFunc("POST /control/unready", func(w http.ResponseWriter, _ *http.Request) {
		unready.Store(true)
		reply(w, pod)
	})
	mux.HandleFunc("POST /control/ready", func(w http.ResponseWriter, _ *http.Request) {
		unready.Store(false)
		reply(w, pod)
	})
	mux.HandleFunc("POST /control/exit", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, pod)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		log.Printf("exiting with status 3 as asked")
		os.Exit(3)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { reply(w, pod) })
	var servers []*http.Server
	for _, addr := range strings.Split(*listen, ",") {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			log.Fatalf("listen %s: %v", addr, err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Fatalf("serve %s: %v", addr, err)
			}
		}()
	}
	log.Printf("%s serving on %s", pod, *listen)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	log.Printf("terminating in %s", *termDelay)
	time.Sleep(*termDelay)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		_ = srv.Shutdown(ctx)
	}
}

func reply(w http.ResponseWriter, pod string) {
	w.Header().Set("X-Pod", pod)
	w.Header().Set("Connection", "close")
	_, _ = fmt.Fprintf(w, "%s\n", pod)
}
