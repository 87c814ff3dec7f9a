// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
	"github.com/deckhouse/service-with-healthchecks/testkit/mariadb"
	"github.com/deckhouse/service-with-healthchecks/testkit/postgres"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// The demo's fixed names and ports: they match docs/examples/ (development/RUN.md).
const (
	demoNamespace = "demo"
	vmPod         = "vm-0"
	webPort       = 8080
	smtpPort      = 2525
	pgPort        = 5432
	// appUser is the role the db traffic loops log in as (the probe uses the example Secret's).
	appUser     = "app"
	appPassword = "app-password"
)

// exampleFiles are applied in this order into the demo namespace; dualStackFile too when the
// demo is dual-stack (Config.DualStack).
var exampleFiles = []string{"docs/examples/db-credentials.yaml", "docs/examples/db.yaml", "docs/examples/vm.yaml"}

// dualStackFile is the dual-stack example: resource web-dual over the pods web-dual-0 and
// web-dual-1.
const dualStackFile = "docs/examples/dual-stack.yaml"

// dualStackResource is the name of the resource in dualStackFile.
const dualStackResource = "web-dual"

// Config is the demo's configuration.
type Config struct {
	// Socket is the control socket's path; its folder holds the kubeconfig and the logs and is
	// removed on exit.
	Socket string
	// ExitAfterReady ends the demo once everything is published and the traffic is OK.
	ExitAfterReady bool
	// Plain prints changed views one below the other instead of redrawing the screen.
	Plain bool
	// Window is the rolling window of the traffic counts.
	Window time.Duration
	// DualStack makes the demo cluster dual-stack and adds the dual-stack example resource, its
	// two pods and a traffic loop through each of its ClusterIPs.
	DualStack bool
	// Nodes is "namespace" (default: pods are network namespaces the harness makes) or "real"
	// (real kubelet nodes, testkit/realnode; IPv4 only): see real.go.
	Nodes string
	// Dataplane is "kube-proxy" (default) or "cilium": a real cilium-agent as the kube-proxy
	// replacement (cluster.Options.Cilium; namespace nodes only).
	Dataplane string
	// Out receives the view and the progress lines.
	Out io.Writer
	// OnView, when set, receives every rendered view (tests).
	OnView func(v *View)
}

// demo is the running demo.
type demo struct {
	cfg    Config
	runDir string
	s      *stack.Stack
	c      *cluster.Cluster
	start  time.Time
	// cluster is the cluster the demo started on namespace pods (stopped after the stack);
	// on real nodes realDemo has it.
	cluster *cluster.Cluster
	// outMu serializes the progress lines (progress.go).
	outMu sync.Mutex

	vm        *cluster.Pod
	web, smtp *cluster.Server
	dualPods  []*cluster.Pod
	// grpcPods and grpcServers are the gRPC example's pods and their health servers (grpc.go).
	grpcPods    []*cluster.Pod
	grpcServers []*grpchealth.Server
	// mysqlPods and mysql are the MySQL example's pods and MariaDB servers (mysql.go); under mu,
	// mysqlPrimary is the index of the writable one.
	mysqlPods    [2]*cluster.Pod
	mysql        [2]*mariadb.Server
	mysqlPrimary int
	dbPods       [2]*cluster.Pod
	pg           [2]*postgres.Server
	kubeconfig   string

	mu       sync.Mutex
	primary  int // index into pg of the primary
	promoted bool
	stopped  map[int]bool // pg servers stopped
	notes    []string     // the last control commands and their results

	loops []*loop
	// real is the real-node part of a demo on real nodes (Config.Nodes "real"), nil otherwise.
	real *realDemo
	// bg are the goroutines that must end before the cleanup.
	bg *sync.WaitGroup
}

// run brings the demo up, shows the view until ctx ends (or, with ExitAfterReady, until
// everything is ready), then removes everything.
func run(ctx context.Context, cfg Config) (err error) {
	if cfg.Window <= 0 {
		cfg.Window = 10 * time.Second
	}
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	if _, err := os.Stat(filepath.Join(postgres.BinDir, "initdb")); err != nil {
		return fmt.Errorf("PostgreSQL 15 is missing (%s): run `make deps` (as root)", postgres.BinDir)
	}
	d := &demo{cfg: cfg, runDir: filepath.Dir(cfg.Socket), start: time.Now(), stopped: map[int]bool{}}
	if err := d.claimRunDir(); err != nil {
		return err
	}
	// The traffic loops, watches and the control socket end before the cleanup starts.
	ctx, cancel := context.WithCancel(ctx)
	var bg sync.WaitGroup
	d.bg = &bg
	defer func() {
		cancel()
		bg.Wait()
		d.progress("stopping: removing the pods, servers, programs and the cluster")
		if cerr := d.cleanup(); cerr != nil {
			err = errors.Join(err, cerr)
		} else {
			d.progress("stopped; nothing is left (%s removed)", d.runDir)
		}
	}()
	if err := d.up(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting
		}
		return err
	}
	ln, err := d.listen()
	if err != nil {
		return err
	}
	defer func() { _ = ln.Close() }()
	d.bg.Go(func() { d.serveControl(ctx, ln) })
	return d.show(ctx)
}

// claimRunDir creates the run folder; a live demo owning it (its socket answers) is an error,
// a dead one's leftovers are removed.
func (d *demo) claimRunDir() error {
	if _, err := os.Stat(d.cfg.Socket); err == nil {
		if _, err := ctlRequest(d.cfg.Socket, "ping"); err == nil {
			return fmt.Errorf("another swh-run is running (its control socket %s answers)", d.cfg.Socket)
		}
		if err := os.RemoveAll(d.runDir); err != nil {
			return fmt.Errorf("removing the leftovers of a previous run in %s: %w", d.runDir, err)
		}
	}
	if err := os.MkdirAll(d.runDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", d.runDir, err)
	}
	return nil
}

// startPostgres starts the primary in db-0 and a streaming replica in db-1, with the probe's
// role from the example Secret and the traffic's role with a table to write to.
func (d *demo) startPostgres(ctx context.Context) (string, error) {
	return d.startPostgresIn(ctx, [2]postgres.Options{
		{ListenAddress: d.dbPods[0].IP.String(), CommandPrefix: d.dbPods[0].CommandPrefix()},
		{ListenAddress: d.dbPods[1].IP.String(), CommandPrefix: d.dbPods[1].CommandPrefix()},
	}, [2]string{d.dbPods[0].Node, d.dbPods[1].Node})
}

// startPostgresIn starts the primary (db-0) and the replica (db-1) with opts, in the pods on
// nodes.
func (d *demo) startPostgresIn(ctx context.Context, opts [2]postgres.Options, nodes [2]string) (string, error) {
	user, password, err := exampleCredentials()
	if err != nil {
		return "", err
	}
	primary, err := postgres.Start(ctx, opts[0])
	if err != nil {
		return "", err
	}
	d.pg[0] = primary
	if err := primary.CreateRole(ctx, user, password); err != nil {
		return "", err
	}
	if err := primary.CreateRole(ctx, appUser, appPassword); err != nil {
		return "", err
	}
	for _, q := range []string{
		"CREATE TABLE hits (n bigint NOT NULL)",
		"INSERT INTO hits VALUES (0)",
		"GRANT SELECT, UPDATE ON hits TO " + appUser,
	} {
		if err := primary.Exec(ctx, q); err != nil {
			return "", err
		}
	}
	replica, err := primary.StartReplica(ctx, opts[1])
	if err != nil {
		return "", err
	}
	d.pg[1] = replica
	return fmt.Sprintf("PostgreSQL 15: primary in db-0 (%s), streaming replica in db-1 (%s)", nodes[0], nodes[1]), nil
}

// exampleCredentials are the user and password of docs/examples/db-credentials.yaml.
func exampleCredentials() (user, password string, err error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", "", err
	}
	data, err := os.ReadFile(filepath.Join(root, exampleFiles[0]))
	if err != nil {
		return "", "", fmt.Errorf("reading the example credentials: %w", err)
	}
	objs, err := stack.DecodeYAML(data)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", exampleFiles[0], err)
	}
	if len(objs) != 1 || objs[0].GetKind() != "Secret" {
		return "", "", fmt.Errorf("%s: want one Secret", exampleFiles[0])
	}
	sd := stringMap(objs[0].Object, "stringData")
	user, password = sd["user"], sd["password"]
	if user == "" || password == "" {
		return "", "", fmt.Errorf("%s: stringData.user and stringData.password must be set", exampleFiles[0])
	}
	if objs[0].Object["type"] != wellknown.SecretTypePostgreSQLCredentials {
		return "", "", fmt.Errorf("%s: type must be %s", exampleFiles[0], wellknown.SecretTypePostgreSQLCredentials)
	}
	return user, password, nil
}

// stringMap is the string values of a map field of an unstructured object.
func stringMap(obj map[string]any, key string) map[string]string {
	raw, _ := obj[key].(map[string]any)
	out := map[string]string{}
	for k, v := range raw {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out
}

// podOfIP names the demo pod with the address.
func (d *demo) podOfIP(ip string) string {
	if d.real != nil && d.real.podIPs[ip] != "" {
		return d.real.podIPs[ip]
	}
	for _, p := range append([]*cluster.Pod{d.vm}, d.dbPods[:]...) {
		if p != nil && p.IP.String() == ip {
			return p.Key()
		}
	}
	return ip
}

// cleanup removes everything in reverse order: traffic loops end with the context; PostgreSQL
// servers (inside the pods' namespaces) before the pods, then the stack (programs, pods,
// kube-proxy, nodes, control plane), then the run folder.
func (d *demo) cleanup() error {
	var errs []error
	for _, srv := range d.grpcServers {
		srv.Stop()
	}
	for _, srv := range d.mysql {
		if srv != nil {
			if err := srv.Remove(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, srv := range d.pg {
		if srv != nil {
			if err := srv.Remove(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if d.s != nil {
		if err := d.s.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if d.cluster != nil {
		if err := d.cluster.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if d.real != nil {
		if err := d.real.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(d.runDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// serviceIPOf is the demo Service's ClusterIP of the family ("" for its primary one).
func (d *demo) serviceIPOf(ctx context.Context, name string, family corev1.IPFamily) (string, error) {
	if family == "" {
		return d.serviceIP(ctx, name)
	}
	return d.c.ClusterIPOf(ctx, demoNamespace+"/"+name, family)
}

// serviceIP is the ClusterIP of a demo Service.
func (d *demo) serviceIP(ctx context.Context, name string) (string, error) {
	var svc corev1.Service
	if err := d.c.Env.Client.Get(ctx, client.ObjectKey{Namespace: demoNamespace, Name: name}, &svc); err != nil {
		return "", err
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return "", fmt.Errorf("service %s has no ClusterIP", name)
	}
	return svc.Spec.ClusterIP, nil
}

// pgRequest is one request of a db traffic loop on a new connection (so kube-proxy picks an
// endpoint for it): a read names the server; a write updates a row on it, which only a
// primary accepts.
func (d *demo) pgRequest(ctx context.Context, ip string, write bool, timeout time.Duration) (pod string, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=postgres sslmode=disable connect_timeout=%d",
		ip, pgPort, appUser, appPassword, int(timeout.Seconds())))
	if err != nil {
		return "", err
	}
	cfg.DialFunc = pgconn.DialFunc(d.c.ClientDialer(timeout))
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var addr string
	if err := conn.QueryRow(ctx, "SELECT host(inet_server_addr())").Scan(&addr); err != nil {
		return "", err
	}
	pod = d.podOfIP(addr)
	if write {
		if _, err := conn.Exec(ctx, "UPDATE hits SET n = n + 1"); err != nil {
			return pod, err
		}
	}
	return pod, nil
}
