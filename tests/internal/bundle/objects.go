// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package bundle

import (
	"fmt"
	"net"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// Objects are rendered objects with lookups.
type Objects []*unstructured.Unstructured

// Counts counts the objects by kind.
func (o Objects) Counts() map[string]int {
	c := map[string]int{}
	for _, obj := range o {
		c[obj.GetKind()]++
	}
	return c
}

// OfKind returns the objects of a kind.
func (o Objects) OfKind(kind string) Objects {
	var out Objects
	for _, obj := range o {
		if obj.GetKind() == kind {
			out = append(out, obj)
		}
	}
	return out
}

// Get returns the object of a kind, namespace and name, or nil.
func (o Objects) Get(kind, namespace, name string) *unstructured.Unstructured {
	for _, obj := range o {
		if obj.GetKind() == kind && obj.GetNamespace() == namespace && obj.GetName() == name {
			return obj
		}
	}
	return nil
}

// Convert converts a rendered object into a typed one.
func Convert(obj *unstructured.Unstructured, into any) error {
	if obj == nil {
		return fmt.Errorf("no object to convert into %T", into)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(obj.Object, into, true); err != nil {
		return fmt.Errorf("converting %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// Deployment is the rendered Deployment namespace/name, typed.
func (o Objects) Deployment(namespace, name string) (*appsv1.Deployment, error) {
	d := &appsv1.Deployment{}
	return d, Convert(o.Get("Deployment", namespace, name), d)
}

// DaemonSet is the rendered DaemonSet namespace/name, typed.
func (o Objects) DaemonSet(namespace, name string) (*appsv1.DaemonSet, error) {
	d := &appsv1.DaemonSet{}
	return d, Convert(o.Get("DaemonSet", namespace, name), d)
}

// Container returns the container of a pod spec by name, or nil.
func Container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// Flag returns the value of --name=value in a container's args and whether it is there.
func Flag(c *corev1.Container, name string) (string, bool) {
	prefix := "--" + name + "="
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, prefix); ok {
			return v, true
		}
	}
	return "", false
}

// Env returns a container's environment variable by name, or nil.
func Env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// ProxyConfig is the part of kube-rbac-proxy's configuration the chart sets.
type ProxyConfig struct {
	Upstreams []struct {
		Upstream      string `json:"upstream"`
		Path          string `json:"path"`
		Authorization struct {
			ResourceAttributes struct {
				Namespace   string `json:"namespace"`
				APIGroup    string `json:"apiGroup"`
				APIVersion  string `json:"apiVersion"`
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
				Name        string `json:"name"`
			} `json:"resourceAttributes"`
		} `json:"authorization"`
	} `json:"upstreams"`
}

// RBACProxyConfig parses the KUBE_RBAC_PROXY_CONFIG of a kube-rbac-proxy container.
func RBACProxyConfig(c *corev1.Container) (*ProxyConfig, error) {
	e := Env(c, "KUBE_RBAC_PROXY_CONFIG")
	if e == nil {
		return nil, fmt.Errorf("container %s has no KUBE_RBAC_PROXY_CONFIG", c.Name)
	}
	cfg := &ProxyConfig{}
	if err := yaml.UnmarshalStrict([]byte(e.Value), cfg); err != nil {
		return nil, fmt.Errorf("parsing KUBE_RBAC_PROXY_CONFIG of %s: %w", c.Name, err)
	}
	return cfg, nil
}

// HostPort is the host:port of a URL like http://127.0.0.1:8080/metrics.
func HostPort(url string) (string, error) {
	rest, ok := strings.CutPrefix(url, "http://")
	if !ok {
		return "", fmt.Errorf("upstream %q is not plain http", url)
	}
	hostPort, _, _ := strings.Cut(rest, "/")
	if _, _, err := net.SplitHostPort(hostPort); err != nil {
		return "", fmt.Errorf("upstream %q: %w", url, err)
	}
	return hostPort, nil
}
