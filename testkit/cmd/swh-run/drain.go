// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// drainedWhy is the view's reason for a pod drained from a port of a resource by its
// annotation (the agent's rule: "*", "resource" or "resource/port"), "" when it is not.
func drainedWhy(pod *corev1.Pod, resource, port string) string {
	v, ok := pod.Annotations[wellknown.AnnotationDrain]
	if !ok {
		return ""
	}
	covered := strings.TrimSpace(v) == wellknown.DrainAll
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		covered = covered || e == resource || e == resource+"/"+port
	}
	if !covered {
		return ""
	}
	return "drained by annotation " + wellknown.AnnotationDrain + "=" + v
}
