// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// verifyRetry is how soon a resource is looked at again while a slice of it has a version the
// audit has not judged yet (its endpoints are not counted until it has).
const verifyRetry = 500 * time.Millisecond

// verifyGrace is how long the status waits for the audit to judge a slice version; past it,
// the endpoints not judged yet count (those the audit found false never do).
const verifyGrace = 10 * time.Second

// waitedForAudit tells whether the resource has waited verifyGrace for the audit (since its
// first reconcile that found a slice version not judged yet); start records that first time.
func (r *Reconciler) waitedForAudit(key types.NamespacedName, start bool) bool {
	if r.verified == nil {
		return true
	}
	now := r.now()
	v, ok := r.auditWait.Load(key)
	if !ok {
		if start {
			r.auditWait.Store(key, now)
		}
		return false
	}
	since, _ := v.(time.Time)
	return now.Sub(since) >= verifyGrace
}
