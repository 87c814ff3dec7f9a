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

// report prints the markdown section: one row per round and the medians.
func report(w io.Writer, o options, rs []result) {
	n := float64(o.resources)
	p := func(format string, a ...any) { _, _ = fmt.Fprintf(w, format, a...) }
	p("## Controller scale\n\n")
	p("%d ServiceWithHealthchecks (one TCP port, one TCP probe) created at once by %d concurrent clients; "+
		"kube-apiserver `--service-cluster-ip-range=%s`; a fresh control plane and controller process per round "+
		"(`--leader-elect=false`, default client settings). Times from the first create to the last watch event. "+
		"Host: %s, %d CPUs, %s.\n\n", o.resources, o.creators, o.serviceCIDR, hostname(), runtime.NumCPU(), runtime.Version())
	p("| round | load before → after | creates done | every Service | every status | controller CPU | peak RSS | controller writes / resource | GETs / resource | reconciles / resource | controller writes / s |\n")
	p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for i, r := range rs {
		p("| %d | %s → %s | %s | %s | %s | %s | %s | %.2f | %.2f | %.2f | %.1f |\n", i+1, r.loadBefore, r.loadAfter,
			dur(r.create), dur(r.services), dur(r.statuses), dur(r.cpu), mib(r.peakRSS),
			r.writes()/n, r.gets()/n, r.reconciles/n, r.writes()/r.statuses.Seconds())
	}
	med := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return median(v)
	}
	p("| **median** | | **%s** | **%s** | **%s** | **%s** | **%s** | **%.2f** | **%.2f** | **%.2f** | **%.1f** |\n\n",
		dur(time.Duration(med(func(r result) float64 { return float64(r.create) }))),
		dur(time.Duration(med(func(r result) float64 { return float64(r.services) }))),
		dur(time.Duration(med(func(r result) float64 { return float64(r.statuses) }))),
		dur(time.Duration(med(func(r result) float64 { return float64(r.cpu) }))),
		mib(int64(med(func(r result) float64 { return float64(r.peakRSS) }))),
		med(func(r result) float64 { return r.writes() / n }),
		med(func(r result) float64 { return r.gets() / n }),
		med(func(r result) float64 { return r.reconciles / n }),
		med(func(r result) float64 { return r.writes() / r.statuses.Seconds() }))

	keys := map[string]bool{}
	for _, r := range rs {
		for k := range r.apiWrites {
			keys[k] = true
		}
		for k := range r.serviceW {
			keys["controller: "+k] = true
		}
		keys["controller: status"] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	p("Requests per resource by kind, median over rounds. `VERB resource` (with the code when not 2xx) from the API server's " +
		"`apiserver_request_total` between the controller being ready and its counters settling, the benchmark's own creates " +
		"subtracted, watches and lists left out; `ipaddresses` (ClusterIP allocation) and `leases` are the API server's own " +
		"writes and are not counted as the controller's. `controller: ...` from the controller's `swh_controller_service_writes_total` " +
		"and `swh_controller_status_writes_total`.\n\n")
	p("| request | per resource |\n| --- | ---: |\n")
	for _, k := range sorted {
		v := med(func(r result) float64 {
			if k == "controller: status" {
				return r.statusW
			}
			if op, ok := strings.CutPrefix(k, "controller: "); ok {
				return r.serviceW[op]
			}
			return r.apiWrites[k]
		})
		p("| %s | %.2f |\n", k, v/n)
	}
	p("\nController process start to `/readyz`: %s (median).\n\n",
		dur(time.Duration(med(func(r result) float64 { return float64(r.readyAfter) }))))
}

// writes counts the controller's successful and failed writes seen by the API server.
func (r result) writes() float64 {
	var s float64
	for k, v := range r.apiWrites {
		verb, rest, _ := strings.Cut(k, " ")
		resource, _, _ := strings.Cut(rest, " ")
		if verb == "GET" || verb == "LIST" || resource == "ipaddresses" || resource == "leases" {
			continue
		}
		s += v
	}
	return s
}

// gets counts the GETs (and pod LISTs) seen by the API server.
func (r result) gets() float64 {
	var s float64
	for k, v := range r.apiWrites {
		if strings.HasPrefix(k, "GET ") || strings.HasPrefix(k, "LIST ") {
			s += v
		}
	}
	return s
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
