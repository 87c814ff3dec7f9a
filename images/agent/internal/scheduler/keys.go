// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// Key identifies a target: (resource, pod, probe index) and a fingerprint of everything a run
// depends on. When a probe or the pod's address changes, the target is a new one with a fresh
// threshold count; an unchanged one keeps its state across reconciles. Keys are comparable and
// of fixed size (the probe is hashed once per reconcile, not formatted per pod).
type Key struct {
	Resource types.NamespacedName
	PodUID   types.UID
	// Probe is the index of the probe in spec.healthcheck.probes.
	Probe       int
	Fingerprint Fingerprint
}

// Fingerprint is what one run depends on besides the pod: the probe's content, the address
// dialled, the resolved port and the period.
type Fingerprint struct {
	Probe   ProbeDigest
	Address string
	Port    int32
	Period  time.Duration
}

// ProbeDigest is a digest of a probe's content (DigestProbe).
type ProbeDigest [16]byte

// DigestProbe digests a probe: the SHA-256 of its JSON encoding, truncated. Compute it once per
// probe and reconcile and share it among the probe's targets.
func DigestProbe(p v1alpha1.Probe) ProbeDigest {
	raw, err := json.Marshal(p)
	if err != nil {
		// A probe is plain data; this cannot happen. Fall back to a digest of its Go text.
		raw = fmt.Appendf(nil, "%#v", p)
	}
	sum := sha256.Sum256(raw)
	var d ProbeDigest
	copy(d[:], sum[:])
	return d
}

// Target is one probe of one pod.
type Target struct {
	Key   Key
	Probe v1alpha1.Probe
	// Namespace of the pod (and of credential Secrets).
	Namespace string
	PodName   string
	PodIP     string
	// Port is the probe's target port resolved on the pod.
	Port int32
	// NotBefore is the pod's start plus initialDelaySeconds: no run happens earlier.
	NotBefore time.Time
	// Period is periodSeconds.
	Period time.Duration
}

// NewKey builds the key of a target from its parts; digest is DigestProbe of the probe.
func NewKey(resource types.NamespacedName, podUID types.UID, index int, digest ProbeDigest, podIP string, port int32, period time.Duration) Key {
	return Key{Resource: resource, PodUID: podUID, Probe: index, Fingerprint: Fingerprint{Probe: digest, Address: podIP, Port: port, Period: period}}
}

// Outcome of one run.
type Outcome struct {
	Pass   bool
	Reason string
	// Err is set when the probe could not be run at all; the run counts as a failure.
	Err error
	// Deferred is set when the probe was not run because an input is still loading (a
	// credential Secret being read): the run counts for nothing, the target keeps its state and
	// runs again at its next due time.
	Deferred bool
}

// Runner runs one probe once (the prober, behind a small interface).
type Runner interface {
	Run(ctx context.Context, t Target) Outcome
}

// RunnerFunc adapts a function to a Runner.
type RunnerFunc func(ctx context.Context, t Target) Outcome

// Run calls f.
func (f RunnerFunc) Run(ctx context.Context, t Target) Outcome { return f(ctx, t) }

// Change is a target's new thresholded result.
type Change struct {
	Key    Key
	Target Target
	Result portrule.ProbeResult
}
