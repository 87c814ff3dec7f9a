// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package stack runs the product on the test cluster harness (testkit/cluster) as real
// programs: the controller program (several replicas with leader election) and one agent
// program per node, built from images/controller and images/agent, against the harness's real
// API server, with the harness's real kube-proxy routing ClusterIP traffic from the slices the
// agents publish.
//
//	func TestMain(m *testing.M) { cluster.RunIsolated(m) }
//
//	func TestSomething(t *testing.T) {
//		s := stack.Start(t, stack.Options{}) // nodes node-a and node-b, kube-proxy, 2 controllers, 2 agents
//		ns := s.Cluster.Env.CreateNamespaceForTest(t, "demo")
//		pod := s.Cluster.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: ...})
//		pod.ServeHTTP(t, 8080)
//		require.NoError(t, s.ApplyYAML(t.Context(), ns, manifest))
//		s.Cluster.WaitProgrammed(t, ns+"/web", 80, pod)
//		require.NoError(t, s.RestartAgent(t.Context(), "node-a"))
//	}
//
// A package whose tests share one stack has stack.Main as its TestMain and calls shared.Get(t)
// in each test (see Shared).
//
// The API is described in development/TEST-HARNESS.md ("The product on the harness").
package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// Namespace is the module namespace: the controllers' leader election Lease and the agents'
// node Leases live there.
const Namespace = wellknown.Namespace

// LeaderElectionID is the name of the controller's leader election Lease.
const LeaderElectionID = "service-with-healthchecks-controller"

// Defaults of Options.
const (
	DefaultControllers        = 2
	DefaultAgentLostGrace     = 6 * time.Second
	DefaultLeaseRenewInterval = time.Second
)

// readyTimeout bounds every wait for a program to become ready.
const readyTimeout = 2 * time.Minute

// Options describe a stack.
type Options struct {
	// Cluster to run on. Nil starts one (cluster.New) with Nodes and KubeProxy: true, which the
	// stack stops with itself.
	Cluster *cluster.Cluster
	// Nodes of the cluster the stack starts; nil means node-a (zone-a) and node-b (zone-b).
	// Ignored when Cluster is set: an agent runs for every node of Cluster.
	Nodes []cluster.Node
	// DualStack makes the cluster the stack starts dual-stack (cluster.Options.DualStack).
	// Ignored when Cluster is set.
	DualStack bool
	// Controllers is the number of controller replicas (default 2), with leader election on.
	Controllers int
	// AgentLostGrace is the controllers' --agent-lost-grace (default 6 s).
	AgentLostGrace time.Duration
	// LeaseRenewInterval is the agents' --lease-renew-interval (default 1 s).
	LeaseRenewInterval time.Duration
	// LogLevel of both programs: debug, info (default) or error.
	LogLevel string
	// LogDir receives one log file per program (controller-0.log, agent-node-a.log, ...), every
	// run of it appended; default a new temporary folder.
	LogDir string
	// ControllerArgs and AgentArgs are further flags of every controller and agent.
	ControllerArgs, AgentArgs []string
	// AgentNodes are further nodes, not among the cluster's simulated ones, that get an agent:
	// real nodes (testkit/realnode), whose Node objects their kubelets register.
	AgentNodes []string
	// NodeKubeProxies starts the cluster (when Cluster is nil) with cluster.Options
	// NodeKubeProxies instead of KubeProxy: every node its own network namespace and its own
	// kube-proxy, for node ports and health check node ports (externalTrafficPolicy: Local).
	NodeKubeProxies bool
	// Cilium starts the cluster (when Cluster is nil) with cluster.Options Cilium instead of
	// KubeProxy: a real cilium-agent is the cluster namespace's datapath (kube-proxy
	// replacement). The tests that use it run in `make test-cilium` (cluster.CiliumEnabled).
	Cilium bool
	// Binaries are the programs to run instead of building HEAD's (Build): another release's,
	// say. UsePrograms changes them for the runs that start later.
	Binaries *Binaries
	// Kubeconfigs, when set, gives the kubeconfig file a program runs with instead of the
	// administrator's (a service account's token bound to a pod on the program's node, say):
	// program is "controller-<i>" or "agent-<node>". It is called at every start of a run; an
	// empty answer keeps the administrator's.
	Kubeconfigs func(program string) string
}

// Stack is the product running on a cluster.
type Stack struct {
	// Cluster is the harness cluster the programs run on.
	Cluster *cluster.Cluster
	// Kubeconfig is the administrator's kubeconfig the programs use.
	Kubeconfig string
	// LogDir holds the programs' log files.
	LogDir string
	// Binaries are the programs run.
	Binaries Binaries

	opts       Options
	ownCluster bool
	client     client.Client

	// controllers are the replica slots, made by New and fixed from then on.
	controllers []*slot

	// ctl serializes the control operations (start, stop, restart, delete); mu guards the
	// fields below for short reads, so status calls never wait for a slow operation.
	ctl     sync.Mutex
	mu      sync.Mutex
	agents  map[string]*slot
	deleted map[string]bool
	stopped bool
}

// Start starts a stack for one test; it is stopped when the test ends, and the programs' logs
// are printed when the test failed. Without root it skips the test (like cluster.Start).
func Start(t testing.TB, opts Options) *Stack {
	t.Helper()
	if opts.Cluster == nil {
		cluster.SkipUnlessIsolated(t)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	s, err := New(ctx, opts)
	if err != nil {
		t.Fatalf("stack: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stack: programs' logs (from %s):\n%s", s.LogDir, s.Logs(64<<10))
		}
		if err := s.Stop(); err != nil {
			t.Errorf("stopping the stack: %v", err)
		}
	})
	return s
}

// New builds the programs (once per process), starts the cluster when Options.Cluster is nil,
// creates the module namespace and starts the controllers and one agent per node. It returns
// when a controller leads and every agent is ready and has renewed its Lease. Call Stop when
// done. A cluster it starts returns cluster.ErrNotRoot without root.
func New(ctx context.Context, opts Options) (s *Stack, err error) {
	if opts.Controllers <= 0 {
		opts.Controllers = DefaultControllers
	}
	if opts.AgentLostGrace <= 0 {
		opts.AgentLostGrace = DefaultAgentLostGrace
	}
	if opts.LeaseRenewInterval <= 0 {
		opts.LeaseRenewInterval = DefaultLeaseRenewInterval
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "info"
	}
	var bins Binaries
	if opts.Binaries != nil {
		bins = *opts.Binaries
	} else if bins, err = Build(); err != nil {
		return nil, err
	}
	s = &Stack{Cluster: opts.Cluster, Binaries: bins, opts: opts, agents: map[string]*slot{}, deleted: map[string]bool{}}
	defer func() {
		if err != nil {
			logs := s.Logs(16 << 10)
			if serr := s.Stop(); serr != nil {
				err = fmt.Errorf("%w (and stopping: %w)", err, serr)
			}
			if logs != "" {
				err = fmt.Errorf("%w\nprograms' logs:\n%s", err, logs)
			}
			s = nil
		}
	}()
	if s.Cluster == nil {
		nodes := opts.Nodes
		if nodes == nil {
			nodes = []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}}
		}
		c, err := cluster.New(cluster.Options{
			Nodes: nodes, KubeProxy: !opts.NodeKubeProxies && !opts.Cilium, NodeKubeProxies: opts.NodeKubeProxies,
			DualStack: opts.DualStack, Cilium: opts.Cilium,
		})
		if err != nil {
			return s, err
		}
		s.Cluster, s.ownCluster = c, true
	}
	s.client = s.Cluster.Env.Client
	s.LogDir = opts.LogDir
	if s.LogDir == "" {
		if s.LogDir, err = os.MkdirTemp("", "swh-stack-logs-"); err != nil {
			return s, fmt.Errorf("creating the log folder: %w", err)
		}
	} else if err := os.MkdirAll(s.LogDir, 0o755); err != nil {
		return s, fmt.Errorf("creating the log folder: %w", err)
	}
	if s.Kubeconfig, err = s.Cluster.Env.WriteKubeConfig(s.LogDir); err != nil {
		return s, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if err := s.client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return s, fmt.Errorf("creating namespace %s: %w", Namespace, err)
	}
	// Every program is started first and waited for after, so they start side by side.
	runs := map[*slot]*process.Process{}
	for i := range opts.Controllers {
		c, err := s.newController(i)
		if err != nil {
			return s, err
		}
		s.controllers = append(s.controllers, c)
		if runs[c], err = c.launch(); err != nil {
			return s, err
		}
	}
	for _, name := range s.agentNodes() {
		a, err := s.newAgent(name)
		if err != nil {
			return s, err
		}
		s.mu.Lock()
		s.agents[name] = a
		s.mu.Unlock()
		if runs[a], err = a.launch(); err != nil {
			return s, err
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for _, c := range s.controllers {
		if err := c.waitReady(waitCtx, runs[c]); err != nil {
			return s, err
		}
	}
	if _, err := s.WaitLeader(waitCtx); err != nil {
		return s, err
	}
	for _, name := range s.agentNodes() {
		a := s.agents[name]
		if err := a.waitReady(waitCtx, runs[a]); err != nil {
			return s, err
		}
	}
	return s, nil
}

// UsePrograms makes every run that starts from now on (StartAgent, RestartAgent,
// StartController, RollAgents, ...) run the programs bins with the further flags
// controllerArgs and agentArgs (instead of Options.ControllerArgs and AgentArgs); the runs
// going on are left as they are. Replacing the programs slot by slot is an upgrade or a
// rollback as a Deployment rollout and a DaemonSet roll do it.
func (s *Stack) UsePrograms(bins Binaries, controllerArgs, agentArgs []string) {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	s.Binaries = bins
	s.opts.ControllerArgs = slices.Clone(controllerArgs)
	s.opts.AgentArgs = slices.Clone(agentArgs)
}

// kubeconfigFor is the kubeconfig file program runs with (Options.Kubeconfigs).
func (s *Stack) kubeconfigFor(program string) string {
	if s.opts.Kubeconfigs != nil {
		if k := s.opts.Kubeconfigs(program); k != "" {
			return k
		}
	}
	return s.Kubeconfig
}

// agentNodes are the names of the nodes that get an agent at the start: the cluster's, then
// Options.AgentNodes.
func (s *Stack) agentNodes() []string {
	var names []string
	for _, n := range s.Cluster.Nodes {
		names = append(names, n.Name)
	}
	return append(names, s.opts.AgentNodes...)
}

// Client is the administrator's client of the cluster's API server.
func (s *Stack) Client() client.Client { return s.client }

// Options are the options the stack runs with, defaults filled in.
func (s *Stack) Options() Options { return s.opts }

// Logs returns the last limit bytes of every program's log, each under a header line.
func (s *Stack) Logs(limit int64) string {
	if s.LogDir == "" {
		return ""
	}
	files, _ := filepath.Glob(filepath.Join(s.LogDir, "*.log"))
	var b strings.Builder
	for _, f := range files {
		fmt.Fprintf(&b, "===== %s =====\n%s\n", filepath.Base(f), process.Tail(f, limit))
	}
	return b.String()
}

// LogFile is the path of a program's log: "controller-0", "agent-node-a".
func (s *Stack) LogFile(program string) string { return filepath.Join(s.LogDir, program+".log") }

// Stop stops every agent and controller (SIGTERM by PID, SIGKILL after 30 s), then the
// cluster when the stack started it. On a cluster it was given, it deletes the Leases of the
// module namespace, so that a later stack starts fresh. Safe to call twice.
func (s *Stack) Stop() error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	s.mu.Lock()
	stopped := s.stopped
	s.stopped = true
	s.mu.Unlock()
	if stopped {
		return nil
	}
	var errs []error
	var emu sync.Mutex
	// Agents first, then controllers; the slots of each kind stop side by side.
	for _, slots := range [][]*slot{slices.Collect(maps.Values(s.agents)), s.controllers} {
		var wg sync.WaitGroup
		for _, sl := range slots {
			wg.Go(func() {
				if err := sl.stop(); err != nil {
					emu.Lock()
					errs = append(errs, err)
					emu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	if s.Cluster != nil && !s.ownCluster {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.client.DeleteAllOf(ctx, &coordinationv1.Lease{}, client.InNamespace(Namespace)); err != nil {
			errs = append(errs, fmt.Errorf("deleting the Leases of %s: %w", Namespace, err))
		}
	}
	if s.ownCluster && s.Cluster != nil {
		if err := s.Cluster.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
