// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// report prints the markdown section: per build, the median of its rounds with every round's
// value after it.
func report(w io.Writer, o options, builds []string, results map[string][]result) {
	p := func(format string, a ...any) { _, _ = fmt.Fprintf(w, format, a...) }
	p("## Controller at cluster scale\n\n")
	p("%d simulated nodes (Node objects; an agent Lease each, renewed every %s by the benchmark, spread over the period), "+
		"%d resources (one TCP port) with a slice on every node (%d slices, one ready endpoint each), written as the agents write them. "+
		"The controller program runs with `--leader-elect=false --agent-lost-grace=%s`", o.nodes, o.renew, o.resources, o.nodes*o.resources, o.grace)
	if o.controllerArgs != "" {
		p(" `%s`", o.controllerArgs)
	}
	if o.candidateArgs != "" {
		p(" (candidate also `%s`)", o.candidateArgs)
	}
	p("; a fresh control plane (`--service-cluster-ip-range=%s`) per round, builds alternating; "+
		"each cell is the median of %d rounds, the rounds in brackets. Host: %s, %d CPUs, %s.\n\n",
		o.serviceCIDR, o.rounds, hostname(), runtime.NumCPU(), runtime.Version())

	p("| build | ready | every status counts every node | start-up CPU | start-up peak RSS | start-up settled (audit pass included) | start-up GETs / audits | steady: CPU over %s | steady: RSS | steady: Go heap in use | steady: requests / s | "+
		"withdrawn: %d stale nodes, after their last renewal | their resources say so | stale: CPU over %s | stale: requests / s |\n",
		o.window, o.stale, o.staleWindow)
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, b := range builds {
		rs := results[b]
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", b,
			durs(rs, func(r result) time.Duration { return r.ready }),
			durs(rs, func(r result) time.Duration { return r.synced }),
			durs(rs, func(r result) time.Duration { return r.startUp }),
			mibs(rs, func(r result) int64 { return r.startPeak }),
			durs(rs, func(r result) time.Duration { return r.settled }),
			nums(rs, "%.0f", func(r result) float64 { return r.startGETs })+" / "+nums(rs, "%.0f", func(r result) float64 { return r.startAudits }),
			durs(rs, func(r result) time.Duration { return r.steady.cpu }),
			mibs(rs, func(r result) int64 { return r.steady.rss }),
			mibs(rs, func(r result) int64 { return r.steady.heap }),
			nums(rs, "%.1f", func(r result) float64 { return perSecond(sum(r.steady.requests), r.steady.length) }),
			durs(rs, func(r result) time.Duration { return r.withdrawn }),
			durs(rs, func(r result) time.Duration { return r.staleStatus }),
			durs(rs, func(r result) time.Duration { return r.stale.cpu }),
			nums(rs, "%.1f", func(r result) float64 { return perSecond(sum(r.stale.requests), r.stale.length) }))
	}
	p("\n")

	if o.phases[phaseBurst] && o.burst > 0 {
		p("%d more resources created at once by %d clients in another namespace of the same fleet: "+
			"from the first create until every status is set (`observedGeneration` = generation, `ServiceSynced=True`), "+
			"the controller's CPU over that and until its counters stayed flat %s, its RSS, and its writes.\n\n", o.burst, o.writers, o.settle)
		p("| build | creates done | every status set | CPU | peak RSS | RSS after | Go heap in use after | controller writes / resource | reconciles / resource |\n")
		p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		n := float64(o.burst)
		for _, b := range builds {
			rs := results[b]
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", b,
				durs(rs, func(r result) time.Duration { return r.burst.creates }),
				durs(rs, func(r result) time.Duration { return r.burst.statuses }),
				durs(rs, func(r result) time.Duration { return r.burst.cpu }),
				mibs(rs, func(r result) int64 { return r.burst.peakRSS }),
				mibs(rs, func(r result) int64 { return r.burst.rssAfter }),
				mibs(rs, func(r result) int64 { return r.burst.heapAfter }),
				nums(rs, "%.2f", func(r result) float64 { return writes(r.burst.apiWrites) / n }),
				nums(rs, "%.2f", func(r result) float64 { return r.burst.reconciles / n }))
		}
		p("\nRequests per burst resource by kind (medians): `VERB resource` from the API server's `apiserver_request_total` " +
			"(watches, lists and Leases left out, the benchmark's own creates subtracted; `ipaddresses` are the API server's own " +
			"ClusterIP allocations), `controller METHOD` from the controller's own `rest_client_requests_total`.\n\n")
		keys := map[string]bool{}
		for _, b := range builds {
			for _, r := range results[b] {
				for k := range r.burst.apiWrites {
					keys[k] = true
				}
				for k := range r.burst.requests {
					keys["controller "+k] = true
				}
			}
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		p("| request | %s |\n| --- |%s\n", strings.Join(builds, " | "), strings.Repeat(" ---: |", len(builds)))
		for _, k := range sorted {
			cells := make([]string, 0, len(builds))
			for _, b := range builds {
				cells = append(cells, fmt.Sprintf("%.2f", median(values(results[b], func(r result) float64 {
					if m, ok := strings.CutPrefix(k, "controller "); ok {
						return r.burst.requests[m] / n
					}
					return r.burst.apiWrites[k] / n
				}))))
			}
			p("| %s | %s |\n", k, strings.Join(cells, " | "))
		}
		p("\n")
	}

	p("Validity: ")
	for i, b := range builds {
		if i > 0 {
			p("; ")
		}
		rs := results[b]
		p("%s: agents known / stale at the end of the steady window %s / %s, slices of live nodes ever withdrawn %s, "+
			"withdrawn slices counted %s (want %d), Lease renewals %s (failed %s, latest %s late at most), load %s",
			b, nums(rs, "%.0f", func(r result) float64 { return r.steady.known }), nums(rs, "%.0f", func(r result) float64 { return r.steady.stales }),
			nums(rs, "%.0f", func(r result) float64 { return float64(r.falseWithdrw) }),
			nums(rs, "%.0f", func(r result) float64 { return r.withdrawnCnt }), o.stale*o.resources,
			nums(rs, "%.0f", func(r result) float64 { return float64(r.renewed) }),
			nums(rs, "%.0f", func(r result) float64 { return float64(r.renewFailed) }),
			durs(rs, func(r result) time.Duration { return r.renewMaxLag }), loads(rs))
	}
	p(".\n")
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

func perSecond(n float64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return n / d.Seconds()
}

func values(rs []result, f func(result) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
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

// cell is the median, then every round's value in brackets when there are several.
func cell(v []float64, format func(float64) string) string {
	out := format(median(v))
	if len(v) > 1 {
		each := make([]string, len(v))
		for i, x := range v {
			each[i] = format(x)
		}
		out += " (" + strings.Join(each, ", ") + ")"
	}
	return out
}

func durs(rs []result, f func(result) time.Duration) string {
	return cell(values(rs, func(r result) float64 { return float64(f(r)) }), func(x float64) string { return dur(time.Duration(x)) })
}

func mibs(rs []result, f func(result) int64) string {
	return cell(values(rs, func(r result) float64 { return float64(f(r)) }), func(x float64) string { return mib(int64(x)) })
}

func nums(rs []result, format string, f func(result) float64) string {
	return cell(values(rs, f), func(x float64) string { return fmt.Sprintf(format, x) })
}

func loads(rs []result) string {
	var out []string
	for _, r := range rs {
		out = append(out, r.loadBefore+" → "+r.loadAfter)
	}
	return strings.Join(out, "; ")
}

func dur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	default:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "?"
	}
	return h
}
