// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// Protocols of the traffic loops.
const (
	protoHTTP    = "http"
	protoSMTP    = "smtp"
	protoPGRead  = "postgres read"
	protoPGWrite = "postgres write"
	protoGRPC    = "grpc"
	protoMySQL   = "mysql"
)

// Pacing of the loops: one request per interval, each on a new connection.
const (
	loopInterval = 100 * time.Millisecond
	pgInterval   = 200 * time.Millisecond
	// loopTimeout bounds one request, its connect included. 2 s was too short on a loaded
	// 2-core machine: in a fresh `make test` (load 7) one MySQL request through the ClusterIP
	// timed out connecting to a pod that served the requests before and after it (TCP
	// retransmits its SYN after 1 s and 3 s); a client library waits longer (MySQL's connect
	// timeout is 10 s). A failure is still counted as one.
	loopTimeout = 5 * time.Second
	// chunk is how long one cluster.Traffic loop runs before its results join the window.
	chunk = time.Second
)

// loop sends requests through one Service's ClusterIP for as long as the demo runs and keeps the
// results of the last window.
type loop struct {
	d       *demo
	service string
	port    int32
	proto   string
	// family picks the Service's ClusterIP of that family ("": its primary ClusterIP).
	family corev1.IPFamily

	mu      sync.Mutex
	results cluster.Results
	// waiting is what the loop waits for in its start-up (startup.go); countFrom is when it
	// started counting (zero before).
	waiting   string
	created   time.Time
	countFrom time.Time
	// totalOK and totalFailed count every request since countFrom; firstFailure is the first
	// failed one (zero when none), kept after it leaves the window.
	totalOK, totalFailed int
	firstFailure         cluster.Result
}

func (d *demo) newLoop(service string, port int32, proto string) *loop {
	return &loop{d: d, service: service, port: port, proto: proto, created: time.Now(), waiting: "not started yet"}
}

func (l *loop) add(rs ...cluster.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range rs {
		if r.OK {
			l.totalOK++
		} else {
			if l.totalFailed == 0 {
				l.firstFailure = r
			}
			l.totalFailed++
		}
	}
	l.results = append(l.results, rs...)
	cut := time.Now().Add(-l.d.cfg.Window)
	i := sort.Search(len(l.results), func(i int) bool { return !l.results[i].Start.Before(cut) })
	l.results = append(cluster.Results(nil), l.results[i:]...)
}

// window returns the results of the last window.
func (l *loop) window() cluster.Results {
	l.add()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(cluster.Results(nil), l.results...)
}

// run sends the loop's requests until ctx ends, from the moment its Service can answer (its
// start-up: startUp).
func (l *loop) run(ctx context.Context) {
	if !l.startUp(ctx) {
		return
	}
	for ctx.Err() == nil {
		switch l.proto {
		case protoPGRead, protoPGWrite:
			l.runPG(ctx)
		case protoGRPC:
			l.runGRPC(ctx)
		default:
			l.runChunk(ctx)
		}
	}
}

// runChunk runs one second of the harness's traffic client (HTTP or SMTP).
func (l *loop) runChunk(ctx context.Context) {
	proto := cluster.HTTP
	var login *cluster.MySQLLogin
	switch l.proto {
	case protoSMTP:
		proto = cluster.SMTP
	case protoMySQL:
		// SELECT @@report_host on a new connection: the answer names the pod.
		proto, login = cluster.MySQL, &cluster.MySQLLogin{User: mysqlApp, Password: mysqlAppPassword}
	}
	start := time.Now()
	opts := cluster.TrafficOptions{
		Service: demoNamespace + "/" + l.service, Port: l.port, Protocol: proto, MySQL: login,
		Interval: pgInterval, Duration: chunk, Timeout: loopTimeout,
	}
	if proto != cluster.MySQL {
		opts.Interval = loopInterval
	}
	var err error
	if l.family != "" {
		opts.Service = ""
		opts.Address, err = l.d.serviceIPOf(ctx, l.service, l.family)
	}
	var tr *cluster.Traffic
	if err == nil {
		tr, err = l.d.c.StartTraffic(ctx, opts)
	}
	if err != nil {
		if ctx.Err() == nil {
			l.add(cluster.Result{Start: start, Err: err.Error()})
			sleep(ctx, chunk)
		}
		return
	}
	l.add(tr.Wait()...)
}

// runPG sends one PostgreSQL request and waits for the next interval.
func (l *loop) runPG(ctx context.Context) {
	l.runOne(ctx, pgInterval, func(ip string) (string, error) {
		return l.d.pgRequest(ctx, ip, l.proto == protoPGWrite, loopTimeout)
	})
}

// runOne sends one request through the Service's ClusterIP (request names the pod that
// answered), records it and waits for the rest of interval.
func (l *loop) runOne(ctx context.Context, interval time.Duration, request func(ip string) (string, error)) {
	start := time.Now()
	res := cluster.Result{Start: start}
	ip, err := l.d.serviceIP(ctx, l.service)
	if err == nil {
		res.Pod, err = request(ip)
	}
	res.Duration = time.Since(start)
	if ctx.Err() != nil {
		return
	}
	res.OK = err == nil
	if err != nil {
		res.Err = err.Error()
	}
	l.add(res)
	sleep(ctx, interval-time.Since(start))
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// short keeps the end of an error, the part a person needs ("connect: connection refused"), on
// one line.
func short(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if parts := strings.Split(s, ": "); len(parts) > 2 {
		s = strings.Join(parts[len(parts)-2:], ": ")
	}
	if len(s) > 90 {
		s = s[:87] + "..."
	}
	return s
}

// key names the loop in View.Traffic: the Service, and "/<family>" for a loop through one
// family's ClusterIP.
func (l *loop) key() string {
	if l.family == "" {
		return l.service
	}
	return l.service + "/" + string(l.family)
}

// Summary is a loop's window as the view shows it.
type Summary struct {
	Service string
	// Family is the ClusterIP's family of a loop through one family ("" for the primary).
	Family corev1.IPFamily
	Proto  string
	Target string
	OK     int
	Failed int
	ByPod  map[string]int
	// LastErr is the newest failure's reason.
	LastErr string
	// LastOK tells whether the newest request succeeded.
	LastOK bool
	// Waiting is what the loop waits for before it counts (its start-up), "" once it counts.
	Waiting string
	// CountFrom is when the loop started counting, zero in its start-up.
	CountFrom time.Time
	// StartUp is how long the loop's start-up took (CountFrom set) or has taken so far.
	StartUp time.Duration
	// CountFromUp is the demo's uptime at CountFrom (the header's "up").
	CountFromUp time.Duration
	// TotalOK and TotalFailed count every request since CountFrom, not only the window's.
	TotalOK, TotalFailed int
	// FirstFailure is the reason of the first failed request since CountFrom and FirstFailureUp
	// the demo's uptime when it started ("" and 0 when none failed).
	FirstFailure   string
	FirstFailureUp time.Duration
}

func (l *loop) summary(ctx context.Context) Summary {
	rs := l.window()
	s := Summary{Service: l.service, Family: l.family, Proto: l.proto, ByPod: map[string]int{}}
	if ip, err := l.d.serviceIPOf(ctx, l.service, l.family); err == nil {
		s.Target = net.JoinHostPort(ip, fmt.Sprint(l.port))
	}
	for _, r := range rs {
		if r.OK {
			s.OK++
			s.ByPod[r.Pod]++
		} else {
			s.Failed++
			s.LastErr = short(r.Err)
		}
	}
	if len(rs) > 0 {
		s.LastOK = rs[len(rs)-1].OK
	}
	l.mu.Lock()
	s.Waiting, s.CountFrom, s.TotalOK, s.TotalFailed = l.waiting, l.countFrom, l.totalOK, l.totalFailed
	if l.totalFailed > 0 {
		s.FirstFailure, s.FirstFailureUp = l.firstFailure.Err, l.firstFailure.Start.Sub(l.d.start)
	}
	l.mu.Unlock()
	if s.CountFrom.IsZero() {
		s.StartUp = time.Since(l.created)
	} else {
		s.StartUp, s.CountFromUp = s.CountFrom.Sub(l.created), s.CountFrom.Sub(l.d.start)
	}
	return s
}
