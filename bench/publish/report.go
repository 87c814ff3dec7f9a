// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// report prints the markdown section.
func report(w io.Writer, o options, rs []sizeResult) {
	p := func(format string, a ...any) { _, _ = fmt.Fprintf(w, format, a...) }
	p("## Publish latency\n\n")
	pods := "`cluster.NewBulkPods`: one network namespace, an address per pod"
	if o.individual {
		pods = "`cluster.NewPod`: a network namespace per pod"
	}
	p("Agent: the agent program on %s probing n pods (%s) over HTTP, `periodSeconds: 1`, thresholds 1; one endpoint's "+
		"server flips 200→500 or back; latency = EndpointSlice watch event showing the endpoint's new `ready` − arrival of the "+
		"decisive probe's request at the pod's server. Built-in: kube-controller-manager `--controllers=endpointslice-controller` "+
		"(defaults: `--endpointslice-updates-batch-period` 0, 100 endpoints per slice) for n Pod objects on %s selected by a "+
		"Service; latency = watch event − start of %s, which flips the pod's Ready and ContainersReady conditions. The two alternate "+
		"sample by sample on one API server; %d samples per path, size and round (half down, half up). Host: %s, %d CPUs, %s.\n\n",
		agentNode, pods, kcmNode, builtinWriteText(o.builtinWrite), o.samples, hostname(), runtime.NumCPU(), runtime.Version())
	if o.policies != "" {
		p("Admission: the chart's ValidatingAdmissionPolicies for the agent's writes (slices, Lease) are installed and the agent acts as its service account on %s, "+
			"so that every slice write of the agent pays the CEL of the agent's slice policy as in a cluster (the built-in "+
			"controller's writes match no policy, as in a cluster).\n\n", agentNode)
	} else {
		p("Admission: no admission policy installed (`POLICIES=0`): the agent's slice writes skip the CEL they pay in a cluster.\n\n")
	}
	p("| endpoints | round | load (1/5/15 min) | agent p50 | agent p99 | built-in p50 | built-in p99 | agent / built-in p50 | agent / built-in p99 |\n")
	p("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		var a50, a99, k50, k99 []float64
		for i, rd := range r.rounds {
			al, kl := lat(rd.agent), lat(rd.kcm)
			p("| %d | %d | %s | %s | %s | %s | %s | %.1f× | %.1f× |\n", r.n, i+1, rd.load,
				ms(pct(al, 50)), ms(pct(al, 99)), ms(pct(kl, 50)), ms(pct(kl, 99)),
				ratio(pct(al, 50), pct(kl, 50)), ratio(pct(al, 99), pct(kl, 99)))
			a50, a99 = append(a50, float64(pct(al, 50))), append(a99, float64(pct(al, 99)))
			k50, k99 = append(k50, float64(pct(kl, 50))), append(k99, float64(pct(kl, 99)))
		}
		m := func(v []float64) time.Duration { return time.Duration(median(v)) }
		p("| **%d** | **median** | | **%s** | **%s** | **%s** | **%s** | **%.1f×** | **%.1f×** |\n", r.n,
			ms(m(a50)), ms(m(a99)), ms(m(k50)), ms(m(k99)), ratio(m(a50), m(k50)), ratio(m(a99), m(k99)))
		var all, allK []time.Duration
		for _, rd := range r.rounds {
			all, allK = append(all, lat(rd.agent)...), append(allK, lat(rd.kcm)...)
		}
		p("| %d | all %d samples | | %s | %s | %s | %s | %.1f× | %.1f× |\n", r.n, len(all),
			ms(pct(all, 50)), ms(pct(all, 99)), ms(pct(allK, 50)), ms(pct(allK, 99)),
			ratio(pct(all, 50), pct(allK, 50)), ratio(pct(all, 99), pct(allK, 99)))
	}
	if o.dataplane != "" {
		reportRules(p, o, rs)
	}
	if o.builtinWrite == builtinWriteKubelet {
		reportFromPatch(p, rs)
	}
	if o.apiServerGC {
		reportGC(p, rs)
	}
	p("\n| endpoints | setup | slices (agent / built-in) | KiB per slice (agent / built-in) | agent: flip → decisive probe, median | built-in: status write round trip, median (of it the GET) | agent CPU while sampling | agent peak RSS | agent slice writes per flip | agent reconcile, mean | one slice update, median (agent / built-in) |\n")
	p("| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rs {
		var phase, rtt, get []time.Duration
		flips := 0
		for _, rd := range r.rounds {
			for _, s := range rd.agent {
				phase = append(phase, s.phase)
			}
			for _, s := range rd.kcm {
				rtt, get = append(rtt, s.phase), append(get, s.get)
			}
			flips += len(rd.agent)
		}
		p("| %d | %s | %d / %d | %.0f / %.0f | %s | %s (%s) | %.0f %% of a core | %.0f MiB | %.2f | %s | %s / %s |\n", r.n, r.setup.Round(100*time.Millisecond),
			r.agentSlices, r.kcmSlices, float64(r.agentSliceBytes)/1024, float64(r.kcmSliceBytes)/1024, ms(pct(phase, 50)), ms(pct(rtt, 50)), ms(pct(get, 50)),
			100*r.agentCPU.Seconds()/r.sampling.Seconds(), float64(r.agentRSS)/(1<<20), r.agentWrites/float64(max(flips, 1)), ms(r.agentReconcile),
			ms(r.agentSliceWrite), ms(r.kcmSliceWrite))
	}
	p("\n")
}

// reportRules compares the two sides up to the dataplane's rules: the latency a client of the
// Service sees, from the decisive instant to the rule that routes the change.
func reportRules(p func(string, ...any), o options, rs []sizeResult) {
	rules := func(ss []sample) []time.Duration {
		out := make([]time.Duration, len(ss))
		for i, s := range ss {
			out[i] = s.rules
		}
		return out
	}
	p("\nUp to the dataplane (`-dataplane %s`: %s). Start as above: the decisive probe's arrival (agent), the start of the "+
		"kubelet's writes (built-in):\n\n", o.dataplane, dataplaneText(o.dataplane))
	p("| endpoints | round | agent p50 | agent p99 | built-in p50 | built-in p99 | agent / built-in p50 | agent / built-in p99 |\n")
	p("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		var all, allK []time.Duration
		for i, rd := range r.rounds {
			al, kl := rules(rd.agent), rules(rd.kcm)
			p("| %d | %d | %s | %s | %s | %s | %.1f× | %.1f× |\n", r.n, i+1, ms(pct(al, 50)), ms(pct(al, 99)), ms(pct(kl, 50)), ms(pct(kl, 99)),
				ratio(pct(al, 50), pct(kl, 50)), ratio(pct(al, 99), pct(kl, 99)))
			all, allK = append(all, al...), append(allK, kl...)
		}
		p("| %d | all %d samples | %s | %s | %s | %s | %.1f× | %.1f× |\n", r.n, len(all), ms(pct(all, 50)), ms(pct(all, 99)),
			ms(pct(allK, 50)), ms(pct(allK, 99)), ratio(pct(all, 50), pct(allK, 50)), ratio(pct(all, 99), pct(allK, 99)))
	}
}

// dataplaneText says what runs as the dataplane and where a sample's rules latency ends.
func dataplaneText(dataplane string) string {
	if dataplane == dataplaneCilium {
		return "cilium-agent v1.20.2 as kube-proxy replacement in the cluster namespace; the end of a sample is the first read " +
			"(every 1 ms, github.com/cilium/ebpf) of its BPF service map `cilium_lb4_services_v2` at which the master entry of " +
			"`ClusterIP:80/TCP` counts one backend fewer or more than before the flip (Cilium writes it after the backend slots; " +
			"the slots are checked to hold the endpoint, or not, after the sample). Cilium takes in EndpointSlice changes on a " +
			"free-running tick (`--lb-reflector-wait-time`, default 500 ms), so every sample of either side waits 0–500 ms for it, " +
			"250 ms on average; a built-in sample starts at a random phase of that tick"
	}
	return "kube-proxy v1.37, nftables, `minSyncPeriod: 100ms`, in the cluster namespace; the end of a sample is the moment " +
		"`nft monitor` shows the Service's dispatch rule written with the endpoint in or out"
}

// builtinWriteText says where a built-in sample starts.
func builtinWriteText(write string) string {
	if write == builtinWriteUpdate {
		return "one status update of the pod (less than a kubelet sends: a lower bound)"
	}
	return "the kubelet's writes (as its status manager: a GET of the pod, then a strategic merge patch of its status)"
}

// reportFromPatch compares the agent with the built-in samples counted from the start of the
// status patch, i.e. without the kubelet's GET: the closest to the one status update of
// -builtin-write=update, a lower bound of the built-in path.
func reportFromPatch(p func(string, ...any), rs []sizeResult) {
	fromPatch := func(ss []sample) []time.Duration {
		out := make([]time.Duration, len(ss))
		for i, s := range ss {
			out[i] = s.latency - s.get
		}
		return out
	}
	p("\nThe built-in samples counted from the start of the status patch (without the kubelet's GET: a lower bound):\n\n")
	p("| endpoints | round | built-in p50 | built-in p99 | agent / built-in p50 | agent / built-in p99 |\n")
	p("| ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		var all, allK []time.Duration
		for i, rd := range r.rounds {
			al, kl := lat(rd.agent), fromPatch(rd.kcm)
			p("| %d | %d | %s | %s | %.1f× | %.1f× |\n", r.n, i+1, ms(pct(kl, 50)), ms(pct(kl, 99)),
				ratio(pct(al, 50), pct(kl, 50)), ratio(pct(al, 99), pct(kl, 99)))
			all, allK = append(all, al...), append(allK, kl...)
		}
		p("| %d | all %d samples | %s | %s | %.1f× | %.1f× |\n", r.n, len(allK), ms(pct(allK, 50)), ms(pct(allK, 99)),
			ratio(pct(all, 50), pct(allK, 50)), ratio(pct(all, 99), pct(allK, 99)))
	}
}

// reportGC splits each side's samples by whether a GC cycle of the API server overlapped them.
func reportGC(p func(string, ...any), rs []sizeResult) {
	p("\nThe API server's garbage collector (`-apiserver-gc`): a sample overlaps a GC cycle when one ended between its start and %s after its watch event. "+
		"Allocation per flip: the API server's `go_memstats_alloc_bytes_total` over %d flips of one side in %s, less the same time idle, after the sampling.\n\n", gcOverlap, allocFlips, allocPhase)
	p("| endpoints | GC cycles while sampling | side | samples overlapping a GC | their p50 / max | the others: p50 / p90 / p99 / max | API server allocation per flip |\n")
	p("| ---: | --- | --- | ---: | --- | --- | ---: |\n")
	for _, r := range rs {
		var agent, kcm []sample
		for _, rd := range r.rounds {
			agent, kcm = append(agent, rd.agent...), append(kcm, rd.kcm...)
		}
		cycles := fmt.Sprintf("%d seen, %d unseen, %d failed polls", len(r.gcEnds), r.gcMissed, r.gcErrs)
		for _, side := range []struct {
			name  string
			ss    []sample
			alloc float64
		}{{"agent", agent, r.agentAlloc}, {"built-in", kcm, r.kcmAlloc}} {
			g := splitByGC(side.ss, r.gcEnds)
			p("| %d | %s | %s | %d of %d | %s / %s | %s / %s / %s / %s | %.2f MB |\n", r.n, cycles, side.name, len(g.hit), len(side.ss),
				ms(pct(g.hit, 50)), ms(pct(g.hit, 100)), ms(pct(g.rest, 50)), ms(pct(g.rest, 90)), ms(pct(g.rest, 99)), ms(pct(g.rest, 100)), side.alloc/1e6)
		}
	}
}

// writeSamples writes every sample as a CSV line, for a closer look at the tail (the stage
// breakdown in development/BENCHMARKS-HISTORY.md joins them with the agent's timestamps).
func writeSamples(path string, rs []sizeResult) error {
	var b strings.Builder
	b.WriteString("side,endpoints,round,address,ready,start_unix_ns,event_unix_ns,latency_ns,phase_ns,get_ns,rules_ns\n")
	for _, r := range rs {
		for i, rd := range r.rounds {
			for side, ss := range map[string][]sample{"agent": rd.agent, "builtin": rd.kcm} {
				for _, s := range ss {
					fmt.Fprintf(&b, "%s,%d,%d,%s,%t,%d,%d,%d,%d,%d,%d\n", side, r.n, i+1, s.addr, s.ready,
						s.start.UnixNano(), s.start.Add(s.latency).UnixNano(), int64(s.latency), int64(s.phase), int64(s.get), int64(s.rules))
				}
			}
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing the samples: %w", err)
	}
	return nil
}

func lat(ss []sample) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = s.latency
	}
	return out
}

// pct is the nearest-rank percentile.
func pct(v []time.Duration, q float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	k := int(math.Ceil(q/100*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "?"
	}
	return h
}
