// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// nodeClaim is the pod-bound service-account token's node claim the agent's policies key on.
const nodeClaim = "authentication.kubernetes.io/node-name"

var agentUserRE = regexp.MustCompile(`request\.userInfo\.username == "(system:serviceaccount:[^"]+:agent)"`)

// installPolicies creates those of the chart's ValidatingAdmissionPolicies and bindings (-policies,
// the output of tests/internal/cmd/renderchart) that judge the agent's writes, and returns the
// user name they match.
func installPolicies(ctx context.Context, cfg *rest.Config, file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("policies: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("policies: %w", err)
	}
	group := "admissionregistration.k8s.io"
	resources := map[string]schema.GroupVersionResource{
		"ValidatingAdmissionPolicy":        {Group: group, Version: "v1", Resource: "validatingadmissionpolicies"},
		"ValidatingAdmissionPolicyBinding": {Group: group, Version: "v1", Resource: "validatingadmissionpolicybindings"},
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return "", fmt.Errorf("policies: %s: %w", file, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if _, ok := resources[obj.GetKind()]; !ok {
			return "", fmt.Errorf("policies: %s: unexpected kind %q", file, obj.GetKind())
		}
		objs = append(objs, obj)
	}
	// Only the policies that judge the agent's writes (and their bindings): the benchmark plays
	// the controller with the administrator's credential (the resource's status), which the
	// controller's policies rightly refuse.
	user := ""
	agentPolicies := map[string]bool{}
	for _, obj := range objs {
		if obj.GetKind() != "ValidatingAdmissionPolicy" {
			continue
		}
		conds, _, _ := unstructured.NestedSlice(obj.Object, "spec", "matchConditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			e, _ := m["expression"].(string)
			if s := agentUserRE.FindStringSubmatch(e); s != nil {
				user = s[1]
				agentPolicies[obj.GetName()] = true
			}
		}
	}
	n := 0
	for _, obj := range objs {
		name := obj.GetName()
		if obj.GetKind() == "ValidatingAdmissionPolicyBinding" {
			name, _, _ = unstructured.NestedString(obj.Object, "spec", "policyName")
		}
		if !agentPolicies[name] {
			continue
		}
		if _, err := dyn.Resource(resources[obj.GetKind()]).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return "", fmt.Errorf("policies: %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		fmt.Fprintf(os.Stderr, "publish: installed %s %s\n", obj.GetKind(), obj.GetName())
		n++
	}
	if n == 0 || user == "" {
		return "", fmt.Errorf("policies: %s holds no policy that matches the agent's service account", file)
	}
	return user, nil
}

// agentKubeconfig writes a kubeconfig that impersonates the agent's service account on node,
// with the node claim of its pod-bound token, so that the agent's policies judge its writes. The
// group system:masters keeps RBAC out of the measurement (the chart's RBAC is not installed).
func agentKubeconfig(admin, dir, user, node string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		return "", fmt.Errorf("agent kubeconfig: %w", err)
	}
	for _, a := range cfg.AuthInfos {
		a.Impersonate = user
		a.ImpersonateGroups = []string{"system:masters", "system:serviceaccounts", "system:authenticated"}
		a.ImpersonateUserExtra = map[string][]string{nodeClaim: {node}}
	}
	p := filepath.Join(dir, "agent-kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		return "", fmt.Errorf("agent kubeconfig: %w", err)
	}
	return p, nil
}

// waitPolicies polls until the agent's slice policy refuses, as the agent's identity, a dry-run
// slice of another node: the policies are in force before the first sample.
func waitPolicies(ctx context.Context, base *rest.Config, ns, user, node string) error {
	cfg := rest.CopyConfig(base)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user,
		Groups: []string{"system:masters", "system:serviceaccounts", "system:authenticated"},
		Extra:  map[string][]string{nodeClaim: {node}}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	forged := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "policy-check-", Namespace: ns,
			Labels:      map[string]string{discoveryv1.LabelManagedBy: wellknown.ManagedBy},
			Annotations: map[string]string{"network.deckhouse.io/node": node + "-other"}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, forged, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("policies: the agent's slice policy did not refuse a forged slice within a minute (last answer: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
