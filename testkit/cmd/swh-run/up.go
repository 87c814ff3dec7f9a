// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// up starts the demo one step at a time, each step printing one line with the time it took
// (progress.go): the programs' build, the cluster (API server, etcd, nodes, kube-proxy), the
// controllers and agents, the pods and their servers, the examples; then the traffic loops.
func (d *demo) up(ctx context.Context) error {
	if d.cfg.Nodes == nodesReal {
		return d.upReal(ctx)
	}
	var bins stack.Binaries
	if err := d.step("building the controller and the agent (go build: a minute or two the first time, cached after)", func() (string, error) {
		var err error
		bins, err = stack.Build()
		return "built the controller and the agent", err
	}); err != nil {
		return fmt.Errorf("building the programs: %w", err)
	}
	nodes := []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}}
	cilium := d.cfg.Dataplane == dataplaneCilium
	dataplane := "kube-proxy"
	if cilium {
		dataplane = "cilium-agent (the kube-proxy replacement)"
	}
	if err := d.step("starting the API server, etcd, the nodes and "+dataplane, func() (string, error) {
		c, err := cluster.New(cluster.Options{Nodes: nodes, KubeProxy: !cilium, Cilium: cilium, DualStack: d.cfg.DualStack})
		if err != nil {
			return "", fmt.Errorf("starting the cluster: %w", err)
		}
		d.cluster, d.c = c, c
		return fmt.Sprintf("started the API server, etcd, nodes %s and %s", strings.Join(d.nodeNames(), ", "), dataplane), nil
	}); err != nil {
		return err
	}
	if err := d.startPrograms(ctx, stack.Options{Cluster: d.c, Binaries: &bins}); err != nil {
		return err
	}
	if err := d.step("starting pod "+demoNamespace+"/"+vmPod, func() (string, error) { return d.addVM(ctx) }); err != nil {
		return err
	}
	if err := d.step("starting PostgreSQL in pods db-0 and db-1", func() (string, error) {
		for i := range d.dbPods {
			var err error
			d.dbPods[i], err = d.c.NewPod(ctx, cluster.PodSpec{
				Namespace: demoNamespace, Name: fmt.Sprintf("db-%d", i), Node: d.c.Nodes[i%len(d.c.Nodes)].Name,
				Labels:         map[string]string{"app": "db"},
				ContainerPorts: []corev1.ContainerPort{{Name: "postgres", ContainerPort: pgPort}},
			})
			if err != nil {
				return "", err
			}
		}
		return d.startPostgres(ctx)
	}); err != nil {
		return err
	}
	if err := d.step("starting MariaDB in pods mysql-0 and mysql-1", func() (string, error) { return d.startMySQL(ctx) }); err != nil {
		return err
	}
	if err := d.step("starting pods orders-0 and orders-1", func() (string, error) { return d.addGRPCPods(ctx) }); err != nil {
		return err
	}
	files := append(slices.Clone(exampleFiles), mysqlFiles...)
	files = append(files, grpcFile)
	if d.cfg.DualStack {
		if err := d.step("starting pods web-dual-0 and web-dual-1", func() (string, error) { return d.addDualStackPods(ctx) }); err != nil {
			return err
		}
		files = append(files, dualStackFile)
	}
	if err := d.step("applying the examples", func() (string, error) { return d.apply(ctx, files) }); err != nil {
		return err
	}
	d.loops = []*loop{
		d.newLoop("db-read", pgPort, protoPGRead),
		d.newLoop("db-write", pgPort, protoPGWrite),
		d.newLoop("smtp", 25, protoSMTP),
		d.newLoop("web", 80, protoHTTP),
		d.newLoop("mysql-db-read", mysqlPort, protoMySQL),
		d.newLoop("mysql-db-write", mysqlPort, protoMySQL),
		d.newLoop(grpcResource, grpcPort, protoGRPC),
	}
	if d.cfg.DualStack {
		v4, v6 := d.newLoop(dualStackResource, 80, protoHTTP), d.newLoop(dualStackResource, 80, protoHTTP)
		v4.family, v6.family = corev1.IPv4Protocol, corev1.IPv6Protocol
		d.loops = append(d.loops, v4, v6)
	}
	d.startLoops(ctx)
	return nil
}

// addVM adds vm-0 with its HTTP and SMTP servers.
func (d *demo) addVM(ctx context.Context) (string, error) {
	var err error
	d.vm, err = d.c.NewPod(ctx, cluster.PodSpec{
		Namespace: demoNamespace, Name: vmPod, Node: d.c.Nodes[0].Name, Labels: map[string]string{"vm": "mail-1"},
		ContainerPorts: []corev1.ContainerPort{{Name: "http", ContainerPort: webPort}, {Name: "smtp", ContainerPort: smtpPort}},
	})
	if err != nil {
		return "", err
	}
	if d.web, err = d.vm.Serve(cluster.HTTP, webPort); err != nil {
		return "", err
	}
	if d.smtp, err = d.vm.Serve(cluster.SMTP, smtpPort); err != nil {
		return "", err
	}
	return fmt.Sprintf("pod %s/%s on %s: HTTP on %d, SMTP on %d", demoNamespace, vmPod, d.vm.Node, webPort, smtpPort), nil
}

// apply server-side applies the example files in order into the demo namespace.
func (d *demo) apply(ctx context.Context, files []string) (string, error) {
	for _, f := range files {
		if err := d.s.ApplyFile(ctx, demoNamespace, f); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("applied %s to namespace %s", strings.Join(files, ", "), demoNamespace), nil
}

// startLoops starts the traffic loops and says how the start-up goes on: each loop counts once
// its Service can answer (startup.go).
func (d *demo) startLoops(ctx context.Context) {
	for _, l := range d.loops {
		d.bg.Go(func() { l.run(ctx) })
	}
	d.progress("up in %s; the view follows: each Service's traffic is counted once kube-proxy routes its ClusterIP to the pods the view shows IN (until then its line says what it waits for)",
		tookString(time.Since(d.start)))
}

// addDualStackPods adds the pods of the dual-stack example, one per node, each with an IPv4 and
// an IPv6 address and an HTTP server on both.
func (d *demo) addDualStackPods(ctx context.Context) (string, error) {
	var done []string
	for i, n := range d.c.Nodes {
		p, err := d.c.NewPod(ctx, cluster.PodSpec{
			Namespace: demoNamespace, Name: fmt.Sprintf("%s-%d", dualStackResource, i), Node: n.Name,
			Labels:         map[string]string{"app": dualStackResource},
			ContainerPorts: []corev1.ContainerPort{{Name: "http", ContainerPort: webPort}},
		})
		if err != nil {
			return "", err
		}
		if _, err := p.Serve(cluster.HTTP, webPort); err != nil {
			return "", err
		}
		d.dualPods = append(d.dualPods, p)
		done = append(done, fmt.Sprintf("%s on %s (%s)", p.Key(), p.Node, joinAddrs(p)))
	}
	return fmt.Sprintf("pods %s: HTTP on %d on both addresses", strings.Join(done, ", "), webPort), nil
}

// joinAddrs lists a pod's addresses: "198.18.0.7, 2001:2:1::3".
func joinAddrs(p *cluster.Pod) string {
	out := make([]string, 0, len(p.IPs))
	for _, a := range p.IPs {
		out = append(out, a.String())
	}
	return strings.Join(out, ", ")
}

// startPrograms starts the controllers and an agent per node on opts.Cluster as one step (their
// logs in the run's folder), then writes the kubeconfig run-ctl hands out and creates the demo's
// namespace: what both start-ups (namespace pods, real nodes) do once their cluster is up.
func (d *demo) startPrograms(ctx context.Context, opts stack.Options) error {
	opts.LogDir = filepath.Join(d.runDir, "logs")
	if err := d.step("starting 2 controllers and an agent per node", func() (string, error) {
		s, err := stack.New(ctx, opts)
		if err != nil {
			return "", fmt.Errorf("starting the stack: %w", err)
		}
		d.s = s
		leader, _ := s.Leader()
		return fmt.Sprintf("controllers ready (controller-%d leads), agents ready on %s; logs in %s", leader, strings.Join(s.Nodes(), ", "), s.LogDir), nil
	}); err != nil {
		return err
	}
	var err error
	if d.kubeconfig, err = opts.Cluster.Env.WriteKubeConfig(d.runDir); err != nil {
		return err
	}
	if err := opts.Cluster.Env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", demoNamespace, err)
	}
	return nil
}
