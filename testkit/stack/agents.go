// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package stack

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// newAgent makes the stopped agent slot of a node: ready once /readyz answers and its node
// Lease has been renewed since the run started.
func (s *Stack) newAgent(node string) (*slot, error) {
	sl, err := newSlot("agent-"+node, s.LogDir, func(metricsAddr, healthAddr string) (string, []string) {
		return s.Binaries.Agent, append([]string{
			"--node-name=" + node,
			"--kubeconfig=" + s.kubeconfigFor("agent-"+node),
			"--metrics-bind-address=" + metricsAddr,
			"--health-probe-bind-address=" + healthAddr,
			"--lease-namespace=" + Namespace,
			"--lease-renew-interval=" + s.opts.LeaseRenewInterval.String(),
			"--log-level=" + s.opts.LogLevel,
		}, s.opts.AgentArgs...)
	})
	if err != nil {
		return nil, err
	}
	sl.ready = func(ctx context.Context, p *process.Process) error { return s.waitLeaseRenewed(ctx, node, p) }
	return sl, nil
}

// waitLeaseRenewed waits until the node's Lease has a renewTime from after run p started.
func (s *Stack) waitLeaseRenewed(ctx context.Context, node string, p *process.Process) error {
	key := client.ObjectKey{Namespace: Namespace, Name: wellknown.AgentLeaseName(node)}
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
		if err := p.Err(); err != nil {
			return false, err
		}
		var l coordinationv1.Lease
		if err := s.client.Get(ctx, key, &l); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		// renewTime has microseconds; the start time is taken before the program started.
		return l.Spec.RenewTime != nil && !l.Spec.RenewTime.Time.Before(p.Started().Truncate(time.Microsecond)), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s to renew Lease %s: %w", p.Name(), key, err)
	}
	return nil
}

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

// agent is the slot of a node's agent that controls may act on.
func (s *Stack) agent(node string) (*slot, error) {
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

// agentSlot is the slot of a node's agent for status reads (nil when there is none).
func (s *Stack) agentSlot(node string) *slot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agents[node]
}

// AgentPID is the process id of the node's agent, 0 while it is stopped.
func (s *Stack) AgentPID(node string) int {
	if a := s.agentSlot(node); a != nil {
		return a.pid()
	}
	return 0
}

// AgentMetricsAddr is the loopback address of the node's agent's /metrics.
func (s *Stack) AgentMetricsAddr(node string) string {
	if a := s.agentSlot(node); a != nil {
		return a.metricsAddr
	}
	return ""
}

// StopAgent stops the node's agent: SIGTERM to its PID, and waits until it has exited. A
// stopped agent stays stopped until StartAgent.
func (s *Stack) StopAgent(_ context.Context, node string) error {
	return s.controlAgent(node, func(a *slot) error { return a.stop() })
}

// StartAgent starts the node's agent (no-op while it runs) and waits until it is ready and
// has renewed its node Lease.
func (s *Stack) StartAgent(ctx context.Context, node string) error {
	return s.controlAgent(node, func(a *slot) error { return a.start(ctx) })
}

// RestartAgent stops the node's agent and starts a new one, waiting until it is ready and has
// renewed its node Lease.
func (s *Stack) RestartAgent(ctx context.Context, node string) error {
	return s.controlAgent(node, func(a *slot) error { return a.restart(ctx) })
}

// controlAgent runs one control on the node's agent slot, serialized with every other.
func (s *Stack) controlAgent(node string, control func(*slot) error) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	a, err := s.agent(node)
	if err != nil {
		return err
	}
	return control(a)
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
	return s.controlAgent(node, func(a *slot) error {
		if err := a.stop(); err != nil {
			return err
		}
		s.mu.Lock()
		s.deleted[node] = true
		s.mu.Unlock()
		if err := s.client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting Node %s: %w", node, err)
		}
		return nil
	})
}
