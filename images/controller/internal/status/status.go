// Package status computes the status of a ServiceWithHealthchecks from what the controller
// observed. It is a pure function; the reconciler writes the result only when it differs from
// the status the resource already has.
package status

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// Observed is everything the status is computed from.
type Observed struct {
	// Resource is the live resource; its current status is the starting point.
	Resource *v1alpha1.ServiceWithHealthchecks
	// Service is the child Service when this resource owns it (or is adopting it), nil otherwise.
	Service *corev1.Service
	// ServiceSynced is the ServiceSynced condition decided by the Service sync.
	ServiceSynced metav1.Condition
	// Slices are the EndpointSlices of this resource. Not used yet: the endpoint conditions
	// (EndpointsAvailable, Ready) and the per-port counts are computed from them here.
	Slices []discoveryv1.EndpointSlice
	// Now stamps conditions whose status changes.
	Now metav1.Time
}

// Compute returns the status the resource should have. Conditions this function does not
// compute are kept as they are.
func Compute(o Observed) v1alpha1.ServiceWithHealthchecksStatus {
	st := *o.Resource.Status.DeepCopy()
	st.ObservedGeneration = o.Resource.Generation

	synced := o.ServiceSynced
	synced.Type = v1alpha1.ConditionServiceSynced
	synced.ObservedGeneration = o.Resource.Generation
	synced.LastTransitionTime = o.Now
	meta.SetStatusCondition(&st.Conditions, synced)

	if o.Service != nil {
		st.ClusterIP = o.Service.Spec.ClusterIP
		st.LoadBalancer = *o.Service.Status.LoadBalancer.DeepCopy()
	} else {
		st.ClusterIP = ""
		st.LoadBalancer = corev1.LoadBalancerStatus{}
	}
	return st
}

// Changed tells whether the computed status differs from the current one.
func Changed(current, computed *v1alpha1.ServiceWithHealthchecksStatus) bool {
	return !equality.Semantic.DeepEqual(current, computed)
}
