package gpucluster

import (
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// Condition types and reasons of a GPUCluster.
const (
	ConditionReady       = "Ready"
	ConditionDegraded    = "Degraded"
	ConditionUnsupported = "Unsupported"

	ReasonReconciled            = "Reconciled"
	ReasonOperandNotReady       = "OperandNotReady"
	ReasonClusterPolicyPresent  = "ClusterPolicyPresent"
	ReasonObjectRefused         = "ObjectRefused"
	ReasonInvalidSpec           = "InvalidSpec"
	ReasonAdminAccessNotAllowed = "AdminAccessNotAllowed"
	ReasonNone                  = "AsExpected"
	ReasonFieldsIgnored         = "FieldsIgnored"
	// ReasonStackInAnotherNamespace: the GPU Operator deployed this
	// GPUCluster's stack in another namespace (status.namespace) than
	// gpufleet's; nothing is deployed beside it.
	ReasonStackInAnotherNamespace = gpustack.ReasonStackInAnotherNamespace
)

// OtherNamespace is the namespace the GPUCluster's status places its
// stack in (the GPU Operator writes its own namespace there), when that is
// not gpufleet's and not confirmed gone with the annotation
// gpustack.AnnotationOtherNamespaceCleared; "" otherwise. DaemonSets do
// not move between namespaces: deploying in gpufleet's beside that stack
// would run the DRA driver's kubelet plugin twice on every GPU node.
func OtherNamespace(gc *nvidiav1alpha1.GPUCluster, namespace string) string {
	prev := gc.Status.Namespace
	if prev == "" || prev == namespace || gc.Annotations[gpustack.AnnotationOtherNamespaceCleared] == prev {
		return ""
	}
	return prev
}

// BlockingPolicy returns the ClusterPolicy that keeps the GPUCluster from
// being deployed, or nil: the oldest ClusterPolicy created before the
// GPUCluster (at the same second, the ClusterPolicy wins). The device
// plugin a ClusterPolicy deploys and the DRA driver would both offer the
// node's GPUs, and a GPU could go to two pods. NVIDIA's GPU Operator
// refuses both at once; gpufleet keeps whichever came first running and
// holds the other, so that creating one never stops a running stack.
func BlockingPolicy(gc *nvidiav1alpha1.GPUCluster, policies []nvidiav1.ClusterPolicy) *nvidiav1.ClusterPolicy {
	var out *nvidiav1.ClusterPolicy
	for i := range policies {
		p := &policies[i]
		if p.CreationTimestamp.After(gc.CreationTimestamp.Time) {
			continue
		}
		if out == nil || p.CreationTimestamp.Before(&out.CreationTimestamp) ||
			(p.CreationTimestamp.Equal(&out.CreationTimestamp) && p.Name < out.Name) {
			out = p
		}
	}
	return out
}

// Observed is what a pass found, for the status.
type Observed struct {
	Namespace string
	// OtherNamespace: the stack runs in that namespace (OtherNamespace).
	OtherNamespace string
	// Blocking is the ClusterPolicy that holds the GPUCluster, if any.
	Blocking *nvidiav1.ClusterPolicy
	// InvalidSpec is why the spec could not be rendered.
	InvalidSpec string
	// Workloads are the stack's DaemonSets and Deployments as cached
	// (by name; a missing one is not created yet).
	DaemonSets  map[string]*appsv1.DaemonSet
	Deployments map[string]*appsv1.Deployment
	// Want are the workloads' names, in order.
	Want []string
	// Refused are the writes the API server refused ("DaemonSet ns/name:
	// message").
	Refused []string
	// AdminAccessMissing: the namespace lacks the label that allows the
	// monitoring pods' admin-access claims.
	AdminAccessMissing bool
	// Ignored are the spec's fields gpufleet accepts but does not act on.
	Ignored []string
}

// Status computes the GPUCluster's status from what a pass observed. The
// conditions keep their transition times while their status is unchanged.
func Status(gc *nvidiav1alpha1.GPUCluster, o Observed, now time.Time) nvidiav1alpha1.GPUClusterStatus {
	st := gc.Status.DeepCopy()
	st.ObservedGeneration = gc.Generation
	meta.RemoveStatusCondition(&st.Conditions, gpustack.ConditionPreviousOperator)
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg,
			ObservedGeneration: gc.Generation, LastTransitionTime: metav1.NewTime(now)})
	}
	if o.OtherNamespace != "" {
		st.State = nvidiav1alpha1.GPUClusterNotReady
		st.Components = nil
		msg := fmt.Sprintf("the stack of this GPUCluster runs in namespace %s (status.namespace) and gpufleet runs in %s: deploying here would run the DRA driver's kubelet plugin twice on every GPU node. "+
			"Run gpufleet in namespace %s to take that stack over without restarting it, or remove that stack and annotate the GPUCluster %s=%s",
			o.OtherNamespace, o.Namespace, o.OtherNamespace, gpustack.AnnotationOtherNamespaceCleared, o.OtherNamespace)
		set(ConditionReady, metav1.ConditionFalse, ReasonStackInAnotherNamespace, msg)
		set(ConditionDegraded, metav1.ConditionTrue, ReasonStackInAnotherNamespace, msg)
		return *st
	}
	st.Namespace = o.Namespace
	if len(o.Ignored) > 0 {
		set(ConditionUnsupported, metav1.ConditionTrue, ReasonFieldsIgnored,
			"accepted but not acted on by gpufleet: "+strings.Join(o.Ignored, ", "))
	} else {
		meta.RemoveStatusCondition(&st.Conditions, ConditionUnsupported)
	}
	switch {
	case o.Blocking != nil:
		st.State = nvidiav1alpha1.GPUClusterNotReady
		st.Components = nil
		msg := fmt.Sprintf("ClusterPolicy %s (created %s) deploys the GPU stack with the device plugin; the DRA driver beside it would offer the same GPUs a second time. Nothing of the GPUCluster is deployed while it exists: delete the ClusterPolicy to switch to DRA, or this GPUCluster to keep the device plugin",
			o.Blocking.Name, o.Blocking.CreationTimestamp.UTC().Format(time.RFC3339))
		set(ConditionReady, metav1.ConditionFalse, ReasonClusterPolicyPresent, msg)
		set(ConditionDegraded, metav1.ConditionTrue, ReasonClusterPolicyPresent, msg)
		return *st
	case o.InvalidSpec != "":
		st.State = nvidiav1alpha1.GPUClusterNotReady
		set(ConditionReady, metav1.ConditionFalse, ReasonInvalidSpec, o.InvalidSpec)
		set(ConditionDegraded, metav1.ConditionTrue, ReasonInvalidSpec, o.InvalidSpec)
		return *st
	}
	st.Components = nil
	var notReady []string
	for _, name := range o.Want {
		c := workloadStatus(name, o)
		st.Components = append(st.Components, c)
		if c.NodesReady < c.NodesDesired || c.Message != "" {
			notReady = append(notReady, fmt.Sprintf("%s %d/%d ready%s", name, c.NodesReady, c.NodesDesired, suffix(c.Message)))
		}
	}
	var degraded []string
	reason := ReasonNone
	if o.AdminAccessMissing {
		reason = ReasonAdminAccessNotAllowed
		degraded = append(degraded, fmt.Sprintf("namespace %s lacks the label %s=true: DCGM and dcgm-exporter claim every GPU of their node with admin access, which the API server allows only there (kubectl label namespace %s %s=true)",
			o.Namespace, LabelAdminAccess, o.Namespace, LabelAdminAccess))
	}
	if len(o.Refused) > 0 {
		if reason == ReasonNone {
			reason = ReasonObjectRefused
		}
		degraded = append(degraded, "the API server refused: "+strings.Join(o.Refused, "; ")+" (retried with backoff; the rest of the stack is reconciled)")
	}
	if len(degraded) > 0 {
		set(ConditionDegraded, metav1.ConditionTrue, reason, strings.Join(degraded, "; "))
	} else {
		set(ConditionDegraded, metav1.ConditionFalse, ReasonNone, "")
	}
	switch {
	case len(notReady) > 0 || len(degraded) > 0:
		st.State = nvidiav1alpha1.GPUClusterNotReady
		msg := strings.Join(notReady, "; ")
		r := ReasonOperandNotReady
		if msg == "" {
			r, msg = reason, "see the Degraded condition"
		}
		set(ConditionReady, metav1.ConditionFalse, r, msg)
	default:
		st.State = nvidiav1alpha1.GPUClusterReady
		set(ConditionReady, metav1.ConditionTrue, ReasonReconciled, "every workload of the stack is ready on its nodes")
	}
	return *st
}

func suffix(msg string) string {
	if msg == "" {
		return ""
	}
	return " (" + msg + ")"
}

// workloadStatus is one workload's rollout: a DaemonSet's nodes, a
// Deployment's replicas.
func workloadStatus(name string, o Observed) nvidiav1.ComponentStatus {
	c := nvidiav1.ComponentStatus{Name: name, Enabled: true}
	if ds, ok := o.DaemonSets[name]; ok && ds != nil {
		c.NodesDesired, c.NodesReady = ds.Status.DesiredNumberScheduled, min(ds.Status.NumberReady, ds.Status.UpdatedNumberScheduled)
		if ds.Status.ObservedGeneration < ds.Generation {
			c.Message = "update not yet observed by the DaemonSet controller"
		}
		return c
	}
	if d, ok := o.Deployments[name]; ok && d != nil {
		c.NodesDesired = 1
		if d.Spec.Replicas != nil {
			c.NodesDesired = *d.Spec.Replicas
		}
		c.NodesReady = min(d.Status.AvailableReplicas, d.Status.UpdatedReplicas)
		if d.Status.ObservedGeneration < d.Generation {
			c.Message = "update not yet observed by the Deployment controller"
		}
		return c
	}
	c.Message = "not created yet"
	return c
}

// Ignored lists the spec's fields gpufleet accepts and does not act on.
func Ignored(gc *nvidiav1alpha1.GPUCluster) []string {
	var out []string
	if e := gc.Spec.DCGMExporter; e != nil {
		if e.ServiceMonitor != nil && e.ServiceMonitor.Enabled != nil && *e.ServiceMonitor.Enabled {
			out = append(out, "dcgmExporter.serviceMonitor")
		}
		if e.HPCJobMapping != nil && e.HPCJobMapping.Enabled != nil && *e.HPCJobMapping.Enabled {
			out = append(out, "dcgmExporter.hpcJobMapping")
		}
		if (e.EnablePodLabels != nil && *e.EnablePodLabels) || (e.EnablePodUID != nil && *e.EnablePodUID) || len(e.PodLabelAllowlistRegex) > 0 {
			out = append(out, "dcgmExporter.enablePodLabels/enablePodUID/podLabelAllowlistRegex")
		}
		if e.Service != nil && e.Service.Type != "" && e.Service.Type != "ClusterIP" {
			out = append(out, "dcgmExporter.service.type")
		}
	}
	if d := gc.Spec.DCGM; d != nil && d.HostPort != 0 {
		out = append(out, "dcgm.hostPort")
	}
	slices.Sort(out)
	return out
}
