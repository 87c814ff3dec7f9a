// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package installed

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// What the test does in the kubelet's place: resolve a container's environment (values,
// $(VAR) references, the downward API) and expand $(VAR) in its arguments.

// resolveEnv resolves a container's env the way the kubelet does, against the stored Pod.
func resolveEnv(pod *corev1.Pod, c *corev1.Container) (map[string]string, []string, error) {
	env := map[string]string{}
	var order []string
	for _, e := range c.Env {
		var v string
		switch {
		case e.ValueFrom == nil:
			v = expand(e.Value, env)
		case e.ValueFrom.FieldRef != nil:
			var err error
			if v, err = fieldRef(pod, e.ValueFrom.FieldRef.FieldPath); err != nil {
				return nil, nil, fmt.Errorf("env %s of %s: %w", e.Name, c.Name, err)
			}
		case e.ValueFrom.ResourceFieldRef != nil:
			var err error
			if v, err = resourceFieldRef(c, e.ValueFrom.ResourceFieldRef); err != nil {
				return nil, nil, fmt.Errorf("env %s of %s: %w", e.Name, c.Name, err)
			}
		default:
			return nil, nil, fmt.Errorf("env %s of %s: this test resolves values, fieldRef and resourceFieldRef only", e.Name, c.Name)
		}
		if _, seen := env[e.Name]; !seen {
			order = append(order, e.Name)
		}
		env[e.Name] = v
	}
	return env, order, nil
}

// fieldRef is the downward API's value of a field path.
func fieldRef(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	}
	return "", fmt.Errorf("field path %q is not resolved by this test", path)
}

// resourceFieldRef is the downward API's value of a container resource, in units of the divisor
// rounded up, as the kubelet computes it.
func resourceFieldRef(c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		return "", fmt.Errorf("resourceFieldRef of another container (%s) is not resolved by this test", ref.ContainerName)
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("resource %q", ref.Resource)
	}
	list := c.Resources.Limits
	if kind == "requests" {
		list = c.Resources.Requests
	}
	q, ok := list[corev1.ResourceName(name)]
	if !ok {
		return "", fmt.Errorf("%s is not set (the kubelet would use the node's allocatable)", ref.Resource)
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if name == "cpu" {
		return strconv.FormatInt((q.MilliValue()+divisor.MilliValue()-1)/divisor.MilliValue(), 10), nil
	}
	return strconv.FormatInt((q.Value()+divisor.Value()-1)/divisor.Value(), 10), nil
}

// expand replaces $(VAR) with the variable's value where it is defined and $$ with $, leaving
// other text as it is: the kubelet's expansion of args and env values.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteByte(s[i])
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// proxyTranslation is the rendered kube-rbac-proxy sidecar turned into upstream v0.19.1's
// command line and config file (development/PACKAGING.md, "kube-rbac-proxy").
type proxyTranslation struct {
	args    []string
	config  []byte
	dropped []string
}

// deckhouseOnlyFlags are the flags of Deckhouse's kube-rbac-proxy build that upstream does not
// have, with why the test leaves each out.
var deckhouseOnlyFlags = map[string]string{
	"stale-cache-interval": "keeps authentication and authorization answers while the API server is unreachable; the test's API server is always there",
	"livez-path":           "serves the sidecar's own liveness; the kubelet's probes of the sidecar are not run here (upstream has /healthz on --proxy-endpoints-port instead)",
}

// upstreamFlags are the rendered flags upstream v0.19.1 takes as they are.
var upstreamFlags = map[string]bool{"secure-listen-address": true, "v": true, "logtostderr": true}

// translateProxy turns the sidecar's resolved arguments and KUBE_RBAC_PROXY_CONFIG into
// upstream's flags: the one upstream becomes --upstream (its scheme and host) with --allow-paths
// (its path), its resourceAttributes the config file's authorization. upstreamOverride, when set,
// replaces the upstream's host:port (the agents' metrics ports are moved, see overrides).
func translateProxy(args []string, env map[string]string, dir, upstreamOverride string) (proxyTranslation, error) {
	var tr proxyTranslation
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		switch {
		case !strings.HasPrefix(a, "--"):
			return tr, fmt.Errorf("argument %q is not a flag", a)
		case upstreamFlags[name]:
			tr.args = append(tr.args, a)
		case deckhouseOnlyFlags[name] != "":
			tr.dropped = append(tr.dropped, a)
		default:
			return tr, fmt.Errorf("flag %s has no translation for upstream kube-rbac-proxy", a)
		}
	}
	raw, ok := env["KUBE_RBAC_PROXY_CONFIG"]
	if !ok {
		return tr, fmt.Errorf("no KUBE_RBAC_PROXY_CONFIG")
	}
	c := &corev1.Container{Env: []corev1.EnvVar{{Name: "KUBE_RBAC_PROXY_CONFIG", Value: raw}}}
	cfg, err := bundle.RBACProxyConfig(c)
	if err != nil {
		return tr, err
	}
	if len(cfg.Upstreams) != 1 {
		return tr, fmt.Errorf("upstream kube-rbac-proxy serves one upstream; the config has %d", len(cfg.Upstreams))
	}
	up := cfg.Upstreams[0]
	u, err := url.Parse(up.Upstream)
	if err != nil {
		return tr, fmt.Errorf("upstream %q: %w", up.Upstream, err)
	}
	if u.Path != up.Path {
		return tr, fmt.Errorf("upstream %s is served at %s: upstream kube-rbac-proxy keeps request paths, so the two must agree", up.Upstream, up.Path)
	}
	host := u.Host
	if upstreamOverride != "" {
		host = upstreamOverride
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		return tr, fmt.Errorf("upstream host %q: %w", host, err)
	}
	tr.args = append(tr.args, "--upstream="+u.Scheme+"://"+host+"/", "--allow-paths="+up.Path)
	attrs := up.Authorization.ResourceAttributes
	tr.config, err = yaml.Marshal(map[string]any{"authorization": map[string]any{"resourceAttributes": map[string]any{
		"namespace": attrs.Namespace, "apiGroup": attrs.APIGroup, "apiVersion": attrs.APIVersion,
		"resource": attrs.Resource, "subresource": attrs.Subresource, "name": attrs.Name,
	}}})
	if err != nil {
		return tr, err
	}
	file := filepath.Join(dir, "kube-rbac-proxy.yaml")
	if err := os.WriteFile(file, tr.config, 0o600); err != nil {
		return tr, err
	}
	tr.args = append(tr.args, "--config-file="+file)
	return tr, nil
}
