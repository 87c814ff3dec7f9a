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
// The API is described in development/TEST-HARNESS.md ("The product on the harness").
package stack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// Namespace is the module namespace: the controllers' leader election Lease and the agents'
// node Leases live there.
const Namespace = "d8-service-with-healthchecks"

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

	// ctl serializes the control operations (start, stop, restart, delete); mu guards the
	// fields below for short reads, so status calls never wait for a slow operation.
	ctl         sync.Mutex
	mu          sync.Mutex
	controllers []*controller
	agents      map[string]*agent
	deleted     map[string]bool
	stopped     bool
}

// controller is one replica slot; proc is nil while it is stopped.
type controller struct {
	index       int
	metricsAddr string
	healthAddr  string
	proc        *proc
}

// agent is one node's agent; proc is nil while it is stopped.
type agent struct {
	node        string
	metricsAddr string
	healthAddr  string
	proc        *proc
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
	bins, err := Build()
	if err != nil {
		return nil, err
	}
	s = &Stack{Cluster: opts.Cluster, Binaries: bins, opts: opts, agents: map[string]*agent{}, deleted: map[string]bool{}}
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
		c, err := cluster.New(cluster.Options{Nodes: nodes, KubeProxy: true})
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
	for i := range opts.Controllers {
		c := &controller{index: i}
		if c.metricsAddr, err = freeLoopbackAddr(); err != nil {
			return s, err
		}
		if c.healthAddr, err = freeLoopbackAddr(); err != nil {
			return s, err
		}
		s.controllers = append(s.controllers, c)
		if err := s.startController(c); err != nil {
			return s, err
		}
	}
	for _, n := range s.Cluster.Nodes {
		a := &agent{node: n.Name}
		if a.metricsAddr, err = freeLoopbackAddr(); err != nil {
			return s, err
		}
		if a.healthAddr, err = freeLoopbackAddr(); err != nil {
			return s, err
		}
		s.agents[n.Name] = a
		if err := s.startAgent(a); err != nil {
			return s, err
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for _, c := range s.controllers {
		if err := s.waitHealthy(waitCtx, c.proc, c.healthAddr); err != nil {
			return s, err
		}
	}
	if _, err := s.WaitLeader(waitCtx); err != nil {
		return s, err
	}
	for _, n := range s.Cluster.Nodes {
		if err := s.waitAgent(waitCtx, s.agents[n.Name]); err != nil {
			return s, err
		}
	}
	return s, nil
}

// Client is the administrator's client of the cluster's API server.
func (s *Stack) Client() client.Client { return s.client }

// Options are the options the stack runs with, defaults filled in.
func (s *Stack) Options() Options { return s.opts }

func (s *Stack) controllerArgs(c *controller) []string {
	return append([]string{
		"--kubeconfig=" + s.Kubeconfig,
		"--metrics-bind-address=" + c.metricsAddr,
		"--health-probe-bind-address=" + c.healthAddr,
		"--leader-elect=true",
		"--leader-election-namespace=" + Namespace,
		"--agent-lease-namespace=" + Namespace,
		"--agent-lost-grace=" + s.opts.AgentLostGrace.String(),
		"--log-level=" + s.opts.LogLevel,
	}, s.opts.ControllerArgs...)
}

func (s *Stack) agentArgs(a *agent) []string {
	return append([]string{
		"--node-name=" + a.node,
		"--kubeconfig=" + s.Kubeconfig,
		"--metrics-bind-address=" + a.metricsAddr,
		"--health-probe-bind-address=" + a.healthAddr,
		"--lease-namespace=" + Namespace,
		"--lease-renew-interval=" + s.opts.LeaseRenewInterval.String(),
		"--log-level=" + s.opts.LogLevel,
	}, s.opts.AgentArgs...)
}

func (s *Stack) startController(c *controller) error {
	name := "controller-" + strconv.Itoa(c.index)
	p, err := startProc(name, s.Binaries.Controller, s.controllerArgs(c), filepath.Join(s.LogDir, name+".log"))
	if err != nil {
		return err
	}
	s.mu.Lock()
	c.proc = p
	s.mu.Unlock()
	return nil
}

func (s *Stack) startAgent(a *agent) error {
	name := "agent-" + a.node
	p, err := startProc(name, s.Binaries.Agent, s.agentArgs(a), filepath.Join(s.LogDir, name+".log"))
	if err != nil {
		return err
	}
	s.mu.Lock()
	a.proc = p
	s.mu.Unlock()
	return nil
}

// waitHealthy waits until the program answers 200 on /readyz of its health address.
func (s *Stack) waitHealthy(ctx context.Context, p *proc, healthAddr string) error {
	hc := &http.Client{Timeout: time.Second}
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
		if p.exited() {
			return false, fmt.Errorf("%s (pid %d) exited: %v; log:\n%s", p.name, p.pid(), exitText(p.err), tail(p.log.Name(), 4<<10))
		}
		resp, err := hc.Get("http://" + healthAddr + "/readyz")
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s to be ready: %w", p.name, err)
	}
	return nil
}

// waitAgent waits until the agent is ready and has renewed its node Lease since it started.
func (s *Stack) waitAgent(ctx context.Context, a *agent) error {
	p := a.proc
	if err := s.waitHealthy(ctx, p, a.healthAddr); err != nil {
		return err
	}
	key := client.ObjectKey{Namespace: Namespace, Name: slicemeta.AgentLeaseName(a.node)}
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
		if p.exited() {
			return false, fmt.Errorf("%s (pid %d) exited: %v", p.name, p.pid(), exitText(p.err))
		}
		var l coordinationv1.Lease
		if err := s.client.Get(ctx, key, &l); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		// renewTime has microseconds; the start time is taken before the program started.
		return l.Spec.RenewTime != nil && !l.Spec.RenewTime.Time.Before(p.started.Truncate(time.Microsecond)), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s to renew Lease %s: %w", p.name, key, err)
	}
	return nil
}

// Logs returns the last max bytes of every program's log, each under a header line.
func (s *Stack) Logs(max int64) string {
	if s.LogDir == "" {
		return ""
	}
	files, _ := filepath.Glob(filepath.Join(s.LogDir, "*.log"))
	var b strings.Builder
	for _, f := range files {
		fmt.Fprintf(&b, "===== %s =====\n%s\n", filepath.Base(f), tail(f, max))
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
	var wg sync.WaitGroup
	var emu sync.Mutex
	stop := func(p *proc) {
		wg.Go(func() {
			if err := p.stop(); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		})
	}
	for _, a := range s.agents {
		if a.proc != nil {
			stop(a.proc)
		}
	}
	wg.Wait()
	for _, c := range s.controllers {
		if c.proc != nil {
			stop(c.proc)
		}
	}
	wg.Wait()
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

// ---- agents ----

// Nodes are the names of the nodes that have an agent slot (deleted nodes excluded), sorted.
func (s *Stack) Nodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.agents {
		if !s.deleted[n] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func (s *Stack) agent(node string) (*agent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.agents[node]
	switch {
	case s.stopped:
		return nil, errors.New("the stack is stopped")
	case !ok:
		return nil, fmt.Errorf("no agent for node %q", node)
	case s.deleted[node]:
		return nil, fmt.Errorf("node %q was deleted", node)
	}
	return a, nil
}

// AgentPID is the process id of the node's agent, 0 while it is stopped.
func (s *Stack) AgentPID(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.agents[node]; ok && a.proc != nil && !a.proc.exited() {
		return a.proc.pid()
	}
	return 0
}

// AgentMetricsAddr is the loopback address of the node's agent's /metrics.
func (s *Stack) AgentMetricsAddr(node string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.agents[node]; ok {
		return a.metricsAddr
	}
	return ""
}

// StopAgent stops the node's agent: SIGTERM to its PID, and waits until it has exited. A
// stopped agent stays stopped until StartAgent.
func (s *Stack) StopAgent(_ context.Context, node string) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	a, err := s.agent(node)
	if err != nil {
		return err
	}
	return s.stopAgentLocked(a)
}

func (s *Stack) stopAgentLocked(a *agent) error {
	if a.proc == nil {
		return nil
	}
	err := a.proc.stop()
	s.mu.Lock()
	a.proc = nil
	s.mu.Unlock()
	return err
}

// StartAgent starts the node's agent (no-op while it runs) and waits until it is ready and
// has renewed its node Lease.
func (s *Stack) StartAgent(ctx context.Context, node string) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	a, err := s.agent(node)
	if err != nil {
		return err
	}
	return s.startAgentLocked(ctx, a)
}

func (s *Stack) startAgentLocked(ctx context.Context, a *agent) error {
	if a.proc != nil && !a.proc.exited() {
		return nil
	}
	if err := s.startAgent(a); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	return s.waitAgent(ctx, a)
}

// RestartAgent stops the node's agent and starts a new one, waiting until it is ready and has
// renewed its node Lease.
func (s *Stack) RestartAgent(ctx context.Context, node string) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	a, err := s.agent(node)
	if err != nil {
		return err
	}
	if err := s.stopAgentLocked(a); err != nil {
		return err
	}
	return s.startAgentLocked(ctx, a)
}

// RollAgents replaces every agent, one node at a time in node order, like a DaemonSet rolling
// update with maxUnavailable 1: each new agent is ready and has renewed its Lease before the
// next node's agent is stopped.
func (s *Stack) RollAgents(ctx context.Context) error {
	for _, n := range s.Nodes() {
		if err := s.RestartAgent(ctx, n); err != nil {
			return fmt.Errorf("rolling the agent of %s: %w", n, err)
		}
	}
	return nil
}

// DeleteNode stops the node's agent (its pod would go with the node) and deletes the Node
// object. Pods scheduled to it are left as they are. The node's agent cannot be started again.
func (s *Stack) DeleteNode(ctx context.Context, node string) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	a, err := s.agent(node)
	if err != nil {
		return err
	}
	if err := s.stopAgentLocked(a); err != nil {
		return err
	}
	s.mu.Lock()
	s.deleted[node] = true
	s.mu.Unlock()
	if err := s.client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting Node %s: %w", node, err)
	}
	return nil
}

// ---- controllers ----

// Controllers is the number of controller replica slots.
func (s *Stack) Controllers() int { return len(s.controllers) }

// ControllerPID is the process id of controller replica i, 0 while it is stopped.
func (s *Stack) ControllerPID(i int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= 0 && i < len(s.controllers) && s.controllers[i].proc != nil && !s.controllers[i].proc.exited() {
		return s.controllers[i].proc.pid()
	}
	return 0
}

// ControllerMetricsAddr is the loopback address of controller replica i's /metrics.
func (s *Stack) ControllerMetricsAddr(i int) string {
	if i < 0 || i >= len(s.controllers) {
		return ""
	}
	return s.controllers[i].metricsAddr
}

func (s *Stack) controller(i int) (*controller, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return nil, errors.New("the stack is stopped")
	case i < 0 || i >= len(s.controllers):
		return nil, fmt.Errorf("no controller replica %d (there are %d)", i, len(s.controllers))
	}
	return s.controllers[i], nil
}

// Leader is the index of the controller replica that leads now: the one whose
// leader_election_master_status metric is 1. It returns -1 and an error when none does.
func (s *Stack) Leader() (int, error) {
	s.mu.Lock()
	var running []*controller
	for _, c := range s.controllers {
		if c.proc != nil && !c.proc.exited() {
			running = append(running, c)
		}
	}
	s.mu.Unlock()
	var leaders []int
	for _, c := range running {
		lead, err := isLeader(c.metricsAddr)
		if err != nil {
			continue
		}
		if lead {
			leaders = append(leaders, c.index)
		}
	}
	switch len(leaders) {
	case 0:
		return -1, errors.New("no controller replica leads")
	case 1:
		return leaders[0], nil
	default:
		return -1, fmt.Errorf("several controller replicas report leading: %v", leaders)
	}
}

// WaitLeader waits until exactly one replica leads and returns it.
func (s *Stack) WaitLeader(ctx context.Context) (int, error) {
	leader := -1
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		var err error
		leader, err = s.Leader()
		return err == nil, nil
	})
	if err != nil {
		return -1, fmt.Errorf("waiting for a controller leader: %w", err)
	}
	return leader, nil
}

// isLeader scrapes a controller's /metrics for leader_election_master_status of its Lease.
func isLeader(metricsAddr string) (bool, error) {
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return false, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("metrics: %s", resp.Status)
	}
	want := `leader_election_master_status{name="` + LeaderElectionID + `"} 1`
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == want {
			return true, nil
		}
	}
	return false, sc.Err()
}

// StopController stops controller replica i (SIGTERM by PID: a leader releases its Lease) and
// waits until it has exited.
func (s *Stack) StopController(_ context.Context, i int) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	c, err := s.controller(i)
	if err != nil {
		return err
	}
	if c.proc == nil {
		return nil
	}
	err = c.proc.stop()
	s.mu.Lock()
	c.proc = nil
	s.mu.Unlock()
	return err
}

// StartController starts controller replica i (no-op while it runs) and waits until it is
// ready (/readyz); it leads only when no other replica does.
func (s *Stack) StartController(ctx context.Context, i int) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	c, err := s.controller(i)
	if err != nil {
		return err
	}
	if c.proc != nil && !c.proc.exited() {
		return nil
	}
	if err := s.startController(c); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	return s.waitHealthy(ctx, c.proc, c.healthAddr)
}

// RestartLeader stops the leading replica, waits until another replica leads, then starts the
// old leader again (as a standby). It returns the old and the new leader.
func (s *Stack) RestartLeader(ctx context.Context) (oldLeader, newLeader int, err error) {
	oldLeader, err = s.WaitLeader(ctx)
	if err != nil {
		return -1, -1, err
	}
	if err := s.StopController(ctx, oldLeader); err != nil {
		return oldLeader, -1, err
	}
	if len(s.controllers) > 1 {
		if newLeader, err = s.WaitLeader(ctx); err != nil {
			return oldLeader, -1, err
		}
	}
	if err := s.StartController(ctx, oldLeader); err != nil {
		return oldLeader, newLeader, err
	}
	if len(s.controllers) == 1 {
		if newLeader, err = s.WaitLeader(ctx); err != nil {
			return oldLeader, -1, err
		}
	}
	return oldLeader, newLeader, nil
}
