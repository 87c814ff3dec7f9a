// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Cilium's load balancer in BPF maps (pkg/loadbalancer/maps, written by its BPF reconciler): the
// services map has, per frontend (address, port, protocol, scope), a master entry in slot 0
// whose value carries Count, the number of backends that get NEW connections, and QCount; slots
// 1..Count name those backends (the active ones, or the terminating ones when none is active:
// KEP-1669), slots after them the quarantined or terminating ones kept for established flows.
// Backends in maintenance (Cilium's reading of ready=false, serving=true, terminating=false) have
// no slot at all. `cilium-dbg bpf lb list` prints the maps:
//
//	--frontends: "198.19.128.7:80/TCP (0)" -> ["0 2[0] (5) [0x0 0x0]"]   backend ID, Count[QCount], revNAT, flags
//	(default):   "198.19.128.7:80/TCP (1)" -> ["198.18.0.3:8080/TCP (5) (1)"]
var (
	ciliumMasterValueRE = regexp.MustCompile(`^\d+ (\d+)\[(\d+)\]`)
	ciliumBackendRE     = regexp.MustCompile(`^(\S+):(\d+)/`)
)

// ciliumProgrammed returns the backends ("ip:port", sorted) Cilium's BPF maps give new
// connections to for the frontend clusterIP:port/proto (external scope), read from the maps
// the datapath uses; none when the frontend is not in them.
func (ca *ciliumAgent) ciliumProgrammed(ctx context.Context, clusterIP string, port int32, proto string) ([]string, error) {
	frontends, err := ca.lbList(ctx, "--frontends")
	if err != nil {
		return nil, err
	}
	fe := net.JoinHostPort(clusterIP, strconv.Itoa(int(port))) + "/" + strings.ToUpper(proto)
	master := frontends[fe+" (0)"]
	if len(master) == 0 {
		return nil, nil
	}
	m := ciliumMasterValueRE.FindStringSubmatch(master[0])
	if m == nil {
		return nil, fmt.Errorf("cilium: cannot read the master entry of %s: %q", fe, master[0])
	}
	count, _ := strconv.Atoi(m[1])
	if count == 0 {
		return nil, nil
	}
	slots, err := ca.lbList(ctx)
	if err != nil {
		return nil, err
	}
	eps := make([]string, 0, count)
	for slot := 1; slot <= count; slot++ {
		entry := slots[fmt.Sprintf("%s (%d)", fe, slot)]
		if len(entry) == 0 {
			return nil, fmt.Errorf("cilium: %s has %d backends but no slot %d (the reconciler is mid-write)", fe, count, slot)
		}
		b := ciliumBackendRE.FindStringSubmatch(entry[0])
		if b == nil {
			return nil, fmt.Errorf("cilium: cannot read slot %d of %s: %q", slot, fe, entry[0])
		}
		eps = append(eps, net.JoinHostPort(strings.Trim(b[1], "[]"), b[2]))
	}
	sort.Strings(eps)
	return eps, nil
}

// CiliumBPFFS is the bpffs of the cluster namespace's cilium-agent (Options.Cilium) as a path
// of this process, for readers that poll its maps faster than `cilium-dbg bpf lb list` can
// (bench/publish): the agent mounts a bpffs of its own in its own mount namespace
// (ciliumAgentScript), which /proc/<agent PID>/root reaches. Cilium pins its load balancer's
// maps under tc/globals (cilium_lb4_services_v2, cilium_lb4_backends_v3, ...); the path stays
// valid while the agent runs. It fails without Options.Cilium, and with NodeKubeProxies (an
// agent per node, none in the cluster namespace).
func (c *Cluster) CiliumBPFFS() (string, error) {
	if c.cilium == nil || c.cilium.proc == nil {
		return "", errors.New("this cluster runs no cilium-agent in the cluster namespace (Options.Cilium without NodeKubeProxies)")
	}
	return filepath.Join("/proc", strconv.Itoa(c.cilium.proc.PID()), "root", "sys", "fs", "bpf"), nil
}

// lbList runs `cilium-dbg bpf lb list -o json` (with extra flags) in the agent's mount namespace.
func (ca *ciliumAgent) lbList(ctx context.Context, flags ...string) (map[string][]string, error) {
	out, err := ca.dbgInAgent(ctx, append([]string{"bpf", "lb", "list", "-o", "json"}, flags...)...)
	if err != nil {
		return nil, err
	}
	list := map[string][]string{}
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("cilium: parsing bpf lb list: %w: %.200s", err, out)
	}
	return list, nil
}

// ciliumDump is the agent's load balancer table for a failure message.
func (ca *ciliumAgent) ciliumDump(ctx context.Context) string {
	out, err := ca.dbgInAgent(ctx, "bpf", "lb", "list")
	if err != nil {
		return err.Error()
	}
	return string(out)
}
