// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command swh-run is `make run`: the product on a small local cluster that is real in every part
// the product touches (API server and etcd with the CRD, two controller replicas with leader
// election, one agent per node, a real kube-proxy, pods that are network namespaces with real
// HTTP, SMTP and PostgreSQL servers), the example resources of docs/EXAMPLES.md applied from
// docs/examples/, and a live view of what is published and what traffic through each Service's
// ClusterIP sees. It runs until Ctrl-C and then removes everything it created.
//
//	swh-run [--exit-after-ready] [--socket PATH] [--plain] [--dual-stack=false] [--nodes real] [--dataplane cilium]   run the demo (root)
//	swh-run ctl COMMAND [ARG]                                  break things from a second terminal
//
// See development/RUN.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// DefaultSocket is the control socket's path on the host.
const DefaultSocket = "/run/swh-run/control.sock"

// notRootMessage is the one line a user without root sees.
const notRootMessage = "swh-run: needs root: it creates network namespaces, veth pairs and nftables rules and runs PostgreSQL as the postgres user; run `sudo make run`"

func main() {
	os.Exit(mainCode(os.Args[1:], os.Stdout, os.Stderr))
}

func mainCode(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "ctl" {
		if err := runCtl(socketFromEnv(), args[1:], stdout); err != nil {
			_, _ = fmt.Fprintln(stderr, "swh-run ctl: "+err.Error())
			return 1
		}
		return 0
	}
	cfg, err := parse(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "swh-run: "+err.Error())
		return 2
	}
	if os.Geteuid() != 0 {
		_, _ = fmt.Fprintln(stderr, notRootMessage)
		return 1
	}
	// From here on this process runs in its own network, mount and PID namespaces (the outer
	// process waits for it and exits with its status).
	cluster.Isolate()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg.Out = stdout
	if err := run(ctx, cfg); err != nil {
		_, _ = fmt.Fprintln(stderr, "swh-run: "+err.Error())
		return 1
	}
	return 0
}

// socketFromEnv is the control socket the ctl client uses: $SWH_RUN_SOCKET or the default.
func socketFromEnv() string {
	if s := os.Getenv("SWH_RUN_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

// Values of Config.Dataplane (--dataplane, make run DATAPLANE=...).
const (
	dataplaneKubeProxy = "kube-proxy"
	dataplaneCilium    = "cilium"
)

func parse(args []string, out io.Writer) (Config, error) {
	cfg := Config{}
	fs := flag.NewFlagSet("swh-run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.Socket, "socket", socketFromEnv(), "Path of the control socket (its folder also holds the kubeconfig and the programs' logs; removed on exit).")
	fs.BoolVar(&cfg.ExitAfterReady, "exit-after-ready", false, "Exit (and clean up) once every resource publishes its pods and the traffic through every Service succeeds: a smoke test.")
	fs.BoolVar(&cfg.Plain, "plain", false, "Print each changed view below the previous one instead of redrawing the screen (the default when stdout is not a terminal).")
	fs.DurationVar(&cfg.Window, "window", 10*time.Second, "Rolling window of the traffic counts.")
	fs.BoolVar(&cfg.DualStack, "dual-stack", true, "Make the demo cluster dual-stack (IPv4 and IPv6) and add the dual-stack example (docs/examples/dual-stack.yaml) with a traffic loop through each of its ClusterIPs; --dual-stack=false: IPv4 only.")
	fs.StringVar(&cfg.Dataplane, "dataplane", dataplaneKubeProxy, "What routes the Services: kube-proxy (nftables) or cilium (a real cilium-agent as the kube-proxy replacement, built by tools/build.sh cilium; not with --nodes=real; make run DATAPLANE=cilium).")
	fs.StringVar(&cfg.Nodes, "nodes", nodesNamespace, "Where the pods run: namespace (network namespaces the harness makes) or real (a kubelet and containerd per node, containers of local images; IPv4 only; make run NODES=real).")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = fmt.Fprint(out, "Usage: swh-run [flags]        run the demo cluster until Ctrl-C (root)\n"+
				"       swh-run ctl COMMAND     control a running demo (see `swh-run ctl help`)\n\nFlags:\n")
			fs.SetOutput(out)
			fs.PrintDefaults()
		}
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q (the control commands are `swh-run ctl ...`)", fs.Arg(0))
	}
	if cfg.Window < time.Second {
		return cfg, fmt.Errorf("--window %s: must be at least 1s", cfg.Window)
	}
	switch cfg.Dataplane {
	case dataplaneKubeProxy:
	case dataplaneCilium:
		if cfg.Nodes == nodesReal {
			return cfg, errors.New("--dataplane=cilium: not with --nodes=real (cilium-agent runs in the cluster namespace as the simulated nodes' datapath)")
		}
	default:
		return cfg, fmt.Errorf("--dataplane %q: want kube-proxy or cilium", cfg.Dataplane)
	}
	switch cfg.Nodes {
	case nodesNamespace:
	case nodesReal:
		// The real nodes' pod network (the CNI bridge with host-local addresses) is IPv4 only.
		dualSet := false
		fs.Visit(func(f *flag.Flag) { dualSet = dualSet || (f.Name == "dual-stack" && cfg.DualStack) })
		if dualSet {
			return cfg, errors.New("--dual-stack: not with --nodes=real (the real nodes' pod network is IPv4 only)")
		}
		cfg.DualStack = false
	default:
		return cfg, fmt.Errorf("--nodes %q: want namespace or real", cfg.Nodes)
	}
	return cfg, nil
}
