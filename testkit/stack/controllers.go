// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package stack

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
)

// leaderSeries is the controller metric that reads 1 on the replica that leads.
const leaderSeries = `leader_election_master_status{name="` + LeaderElectionID + `"}`

// newController makes the stopped slot of controller replica i.
func (s *Stack) newController(i int) (*slot, error) {
	return newSlot("controller-"+strconv.Itoa(i), s.LogDir, func(metricsAddr, healthAddr string) (string, []string) {
		return s.Binaries.Controller, append([]string{
			"--kubeconfig=" + s.kubeconfigFor("controller-"+strconv.Itoa(i)),
			"--metrics-bind-address=" + metricsAddr,
			"--health-probe-bind-address=" + healthAddr,
			"--leader-elect=true",
			"--leader-election-namespace=" + Namespace,
			"--agent-lease-namespace=" + Namespace,
			"--agent-lost-grace=" + s.opts.AgentLostGrace.String(),
			"--log-level=" + s.opts.LogLevel,
		}, s.opts.ControllerArgs...)
	})
}

// Controllers is the number of controller replica slots.
func (s *Stack) Controllers() int { return len(s.controllers) }

// ControllerPID is the process id of controller replica i, 0 while it is stopped.
func (s *Stack) ControllerPID(i int) int {
	if i < 0 || i >= len(s.controllers) {
		return 0
	}
	return s.controllers[i].pid()
}

// ControllerMetricsAddr is the loopback address of controller replica i's /metrics.
func (s *Stack) ControllerMetricsAddr(i int) string {
	if i < 0 || i >= len(s.controllers) {
		return ""
	}
	return s.controllers[i].metricsAddr
}

// controlController runs one control on replica i's slot, serialized with every other.
func (s *Stack) controlController(i int, control func(*slot) error) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	switch {
	case stopped:
		return errors.New("the stack is stopped")
	case i < 0 || i >= len(s.controllers):
		return fmt.Errorf("no controller replica %d (there are %d)", i, len(s.controllers))
	}
	return control(s.controllers[i])
}

// Leader is the index of the controller replica that leads now: the one whose
// leader_election_master_status metric is 1. It returns -1 and an error when none does.
func (s *Stack) Leader() (int, error) {
	var leaders []int
	for i, c := range s.controllers {
		if c.running() != nil && isLeader(c.metricsAddr) {
			leaders = append(leaders, i)
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

// isLeader scrapes a controller's /metrics for leader_election_master_status of its Lease; a
// failed scrape reads as not leading.
func isLeader(metricsAddr string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	fams, err := metrics.Get(ctx, metricsAddr)
	if err != nil {
		return false
	}
	v, err := fams.Value(leaderSeries)
	return err == nil && v == 1
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

// StopController stops controller replica i (SIGTERM by PID: a leader releases its Lease) and
// waits until it has exited.
func (s *Stack) StopController(_ context.Context, i int) error {
	return s.controlController(i, func(c *slot) error { return c.stop() })
}

// StartController starts controller replica i (no-op while it runs) and waits until it is
// ready (/readyz); it leads only when no other replica does.
func (s *Stack) StartController(ctx context.Context, i int) error {
	return s.controlController(i, func(c *slot) error { return c.start(ctx) })
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
