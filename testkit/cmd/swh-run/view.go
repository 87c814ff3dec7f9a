// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// View is one rendering of the demo: the model and its text.
type View struct {
	// Text is what the terminal shows.
	Text string
	// Resources, by name.
	Resources map[string]*ResourceView
	// Traffic, by Service name.
	Traffic map[string]Summary
	// Ready: every resource publishes what it should and every traffic loop is OK.
	Ready bool
}

// textOrNone is the view's text, for messages.
func (v *View) textOrNone() string {
	if v == nil {
		return "(none yet)"
	}
	return v.Text
}

// ResourceView is one ServiceWithHealthchecks as shown.
type ResourceView struct {
	Name      string
	ClusterIP string
	// ClusterIPs are the Service's ClusterIPs, one per family (the primary first).
	ClusterIPs []string
	Ready      string // the Ready condition's status, and its message when not True
	Ports      []PortView
}

// PortView is one Service port: every selected pod, in or out.
type PortView struct {
	Name  string // the port's name, or its number for an unnamed port
	Pods  []PodState
	Ready int
}

// PodState is one pod on one port.
type PodState struct {
	Pod      string
	Node     string
	Endpoint string // ip:port published (one per family, ", "-separated), empty when not published
	In       bool   // published ready (in every family it is published in)
	Serving  bool
	Why      string // why it is out (or "ready")
}

// show renders the view until ctx ends (or, with ExitAfterReady, until it is ready): on every
// change a watch reports, and every second for the traffic counts.
func (d *demo) show(ctx context.Context) error {
	changes := make(chan struct{}, 1)
	d.watch(ctx, changes)
	tty := !d.cfg.Plain && isTerminal(d.cfg.Out)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, printed := "", time.Time{}
	readySince := time.Time{}
	for {
		v := d.render(ctx)
		if d.cfg.OnView != nil {
			d.cfg.OnView(v)
		}
		switch {
		case tty:
			_, _ = fmt.Fprint(d.cfg.Out, "\x1b[H\x1b[2J"+v.Text)
		case stable(v.Text) != last || time.Since(printed) >= plainEvery:
			_, _ = fmt.Fprint(d.cfg.Out, v.Text+"\n")
			last, printed = stable(v.Text), time.Now()
		}
		if d.cfg.ExitAfterReady && v.Ready {
			// Ready for two views in a row, a second apart: the traffic counts are settled.
			if readySince.IsZero() {
				readySince = time.Now()
			} else if time.Since(readySince) >= time.Second {
				if !tty {
					_, _ = fmt.Fprint(d.cfg.Out, v.Text+"\n")
				}
				if err := failedSinceStartUp(v); err != nil {
					return err
				}
				d.progress("ready: every resource publishes its pods and traffic through every Service succeeds, none failed since its start-up (--exit-after-ready)")
				return nil
			}
		} else {
			readySince = time.Time{}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-changes:
			// Let a burst of changes settle before drawing.
			sleep(ctx, 100*time.Millisecond)
		}
	}
}

// failedSinceStartUp is an error naming every traffic loop of the view with a failed request
// since it started counting (after its start-up), with its first failure's time and reason, nil
// when there is none: the smoke run's verdict beyond the last window.
func failedSinceStartUp(v *View) error {
	var failed []string
	for _, k := range slices.Sorted(maps.Keys(v.Traffic)) {
		if sum := v.Traffic[k]; sum.TotalFailed > 0 {
			failed = append(failed, fmt.Sprintf("%s %d of %d (the first at up %s, counting from up %s: %s)", k, sum.TotalFailed,
				sum.TotalOK+sum.TotalFailed, sum.FirstFailureUp.Truncate(100*time.Millisecond), sum.CountFromUp.Truncate(100*time.Millisecond), sum.FirstFailure))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("requests failed after their Service's start-up: %s", strings.Join(failed, ", "))
}

// plainEvery is how often a plain view is printed when nothing but counts and ages changed.
const plainEvery = 10 * time.Second

// volatile matches what changes in every view without news: ages, counts, who answered.
var volatile = regexp.MustCompile(`\d+(\.\d+)?(ms|s|m)\b|\d+ ok, \d+ failed|answered: [^·\n]*|· up [^·]*`)

// stable is the view without its clock line and volatile parts: a plain view is printed when it
// changes.
func stable(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return volatile.ReplaceAllString(s, "")
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// watch signals changes of the demo's resources, slices and the agents' Leases.
func (d *demo) watch(ctx context.Context, changes chan<- struct{}) {
	wc, err := client.NewWithWatch(d.c.Env.Config, client.Options{Scheme: d.c.Env.Scheme})
	if err != nil {
		d.progress("no watches (%v): the view refreshes every second", err)
		return
	}
	lists := []struct {
		list client.ObjectList
		ns   string
	}{
		{&v1alpha1.ServiceWithHealthchecksList{}, demoNamespace},
		{&discoveryv1.EndpointSliceList{}, demoNamespace},
		{&coordinationv1.LeaseList{}, stack.Namespace},
		{&corev1.NodeList{}, ""},
	}
	for _, l := range lists {
		d.bg.Go(func() {
			for ctx.Err() == nil {
				var opts []client.ListOption
				if l.ns != "" {
					opts = append(opts, client.InNamespace(l.ns))
				}
				w, err := wc.Watch(ctx, l.list, opts...)
				if err != nil {
					sleep(ctx, time.Second)
					continue
				}
			events:
				for {
					select {
					case <-ctx.Done():
						w.Stop()
						return
					case _, ok := <-w.ResultChan():
						if !ok {
							break events
						}
						select {
						case changes <- struct{}{}:
						default:
						}
					}
				}
				w.Stop()
			}
		})
	}
}

// render reads the cluster and draws the view.
func (d *demo) render(ctx context.Context) *View {
	v := &View{Resources: map[string]*ResourceView{}, Traffic: map[string]Summary{}}
	var b strings.Builder
	now := time.Now()
	fmt.Fprintf(&b, "service-with-healthchecks demo · %s · up %s · Ctrl-C stops and removes everything\n",
		now.Format("15:04:05"), now.Sub(d.start).Truncate(time.Second))
	cl := d.c.Env.Client
	var (
		swhs   v1alpha1.ServiceWithHealthchecksList
		slcs   discoveryv1.EndpointSliceList
		pods   corev1.PodList
		svcs   corev1.ServiceList
		leases coordinationv1.LeaseList
		nodes  corev1.NodeList
	)
	errs := []error{
		cl.List(ctx, &swhs, client.InNamespace(demoNamespace)),
		cl.List(ctx, &slcs, client.InNamespace(demoNamespace), client.MatchingLabels{discoveryv1.LabelManagedBy: wellknown.ManagedBy}),
		cl.List(ctx, &pods, client.InNamespace(demoNamespace)),
		cl.List(ctx, &svcs, client.InNamespace(demoNamespace)),
		cl.List(ctx, &leases, client.InNamespace(stack.Namespace)),
		cl.List(ctx, &nodes),
	}
	for _, err := range errs {
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(&b, "! reading the API server: %v\n", err)
			break
		}
	}
	d.renderCluster(&b, leases.Items, nodes.Items)

	sort.Slice(swhs.Items, func(i, j int) bool { return swhs.Items[i].Name < swhs.Items[j].Name })
	services := map[string]bool{}
	for _, l := range d.loops {
		services[l.service] = true
	}
	ready := len(swhs.Items) == len(services)
	for i := range swhs.Items {
		r := d.resourceView(&swhs.Items[i], slcs.Items, pods.Items, nodes.Items)
		for _, svc := range svcs.Items {
			if svc.Name == r.Name {
				r.ClusterIPs = svc.Spec.ClusterIPs
			}
		}
		v.Resources[r.Name] = r
		var sums []Summary
		for _, l := range d.loops {
			if l.service == r.Name {
				sum := l.summary(ctx)
				v.Traffic[l.key()] = sum
				sums = append(sums, sum)
			}
		}
		writeResource(&b, r, sums)
		if !resourceReady(r, sums) {
			ready = false
		}
	}
	d.mu.Lock()
	notes := slices.Clone(d.notes)
	d.mu.Unlock()
	b.WriteString("\nbreak things from another terminal: make run-ctl ARGS=help   (or: go run ./testkit/cmd/swh-run ctl help)\n")
	for _, n := range notes {
		fmt.Fprintf(&b, "  %s\n", n)
	}
	v.Ready = ready
	v.Text = b.String()
	return v
}

func (d *demo) renderCluster(b *strings.Builder, leases []coordinationv1.Lease, nodes []corev1.Node) {
	leader, _ := d.s.Leader()
	var ctrls []string
	for i := range d.s.Controllers() {
		pid := d.s.ControllerPID(i)
		switch {
		case pid == 0:
			ctrls = append(ctrls, fmt.Sprintf("controller-%d stopped", i))
		case i == leader:
			ctrls = append(ctrls, fmt.Sprintf("controller-%d (pid %d) LEADER", i, pid))
		default:
			ctrls = append(ctrls, fmt.Sprintf("controller-%d (pid %d) standby", i, pid))
		}
	}
	fmt.Fprintf(b, "controllers: %s\n", strings.Join(ctrls, ", "))
	renewed := map[string]time.Time{}
	for _, l := range leases {
		if l.Spec.HolderIdentity != nil && l.Spec.RenewTime != nil && l.Name == wellknown.AgentLeaseName(*l.Spec.HolderIdentity) {
			renewed[*l.Spec.HolderIdentity] = l.Spec.RenewTime.Time
		}
	}
	exists := map[string]bool{}
	for _, n := range nodes {
		exists[n.Name] = true
	}
	var parts []string
	for _, name := range d.nodeNames() {
		agent := "agent stopped"
		if pid := d.s.AgentPID(name); pid != 0 {
			agent = fmt.Sprintf("agent pid %d", pid)
		}
		if t, ok := renewed[name]; ok {
			agent += fmt.Sprintf(", lease renewed %s ago", time.Since(t).Truncate(100*time.Millisecond))
		}
		if !exists[name] {
			agent = "Node DELETED, " + agent
		}
		parts = append(parts, fmt.Sprintf("%s (%s%s)", name, d.kubeletState(name), agent))
	}
	fmt.Fprintf(b, "nodes: %s\n", strings.Join(parts, "; "))
}

func writeResource(b *strings.Builder, r *ResourceView, sums []Summary) {
	if len(r.ClusterIPs) > 1 {
		fmt.Fprintf(b, "\n%s  ClusterIPs %s  Ready=%s\n", r.Name, strings.Join(r.ClusterIPs, ", "), r.Ready)
	} else {
		fmt.Fprintf(b, "\n%s  ClusterIP %s  Ready=%s\n", r.Name, orDash(r.ClusterIP), r.Ready)
	}
	for _, p := range r.Ports {
		fmt.Fprintf(b, "  port %s: %d/%d pods in\n", p.Name, p.Ready, len(p.Pods))
		for _, s := range p.Pods {
			mark := "OUT"
			if s.In {
				mark = "IN "
			}
			fmt.Fprintf(b, "    %s %-6s on %-7s %-20s %s\n", mark, s.Pod, s.Node, orDash(s.Endpoint), s.Why)
		}
	}
	if len(sums) == 0 {
		sums = []Summary{{}}
	}
	for _, sum := range sums {
		var pods []string
		for p, n := range sum.ByPod {
			pods = append(pods, fmt.Sprintf("%s %d", strings.TrimPrefix(p, demoNamespace+"/"), n))
		}
		sort.Strings(pods)
		proto := sum.Proto
		if sum.Family != "" {
			proto += " over " + string(sum.Family)
		}
		if sum.Service != "" && sum.CountFrom.IsZero() {
			// The start-up: nothing is sent or counted yet (startup.go).
			fmt.Fprintf(b, "  traffic %s %s: starting (%s): %s\n", proto, orDash(sum.Target), sum.StartUp.Truncate(time.Second), sum.Waiting)
			continue
		}
		line := fmt.Sprintf("  traffic %s %s: %d ok, %d failed", proto, orDash(sum.Target), sum.OK, sum.Failed)
		if len(pods) > 0 {
			line += " · answered: " + strings.Join(pods, ", ")
		}
		if sum.Failed > 0 {
			line += " · last failure: " + sum.LastErr
		}
		line += fmt.Sprintf(" · since up %s: %d ok, %d failed", sum.CountFromUp.Truncate(time.Second), sum.TotalOK, sum.TotalFailed)
		b.WriteString(line + "\n")
	}
}

// resourceReady: every pod that should serve the port does, and the traffic of the last window
// had no failure and was answered by every pod the view shows in, through every ClusterIP that
// has a loop (a loop starts counting once the dataplane routes to the pods published so far,
// which may be one of them). Of db-write only the primary should be in.
func resourceReady(r *ResourceView, sums []Summary) bool {
	var in []string
	for _, p := range r.Ports {
		want := len(p.Pods)
		if r.Name == "db-write" || r.Name == "mysql-db-write" {
			want = 1
		}
		if want == 0 || p.Ready != want {
			return false
		}
		for _, pod := range p.Pods {
			if pod.In {
				in = append(in, pod.Pod)
			}
		}
	}
	if len(sums) == 0 {
		return false
	}
	for _, sum := range sums {
		if sum.CountFrom.IsZero() || sum.OK < 5 || sum.Failed != 0 {
			return false
		}
		for _, pod := range in {
			if sum.ByPod[demoNamespace+"/"+pod] == 0 {
				return false
			}
		}
	}
	return true
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
