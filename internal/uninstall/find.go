package uninstall

import (
	"context"
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// Others is what runs gpufleet's operator besides the Deployment an
// uninstall was asked to stop, anywhere in the cluster.
type Others struct {
	// Searched is false when the caller may not list Deployments, pods or
	// leases in every namespace: nothing can be said about the others.
	Searched bool
	// Why names what could not be listed (Searched false).
	Why string
	// Running names each Deployment with replicas, pod and held lease of
	// gpufleet's operator other than the named one's.
	Running []string
}

// findOthers looks in every namespace for gpufleet's operator other than
// the Deployment named namespace/name: Deployments and pods that run it
// (by their command, whatever they are called) and held leases of
// gpufleet's name. A named Deployment that does not exist is looked for
// in the same way: then everything found is "other".
func findOthers(ctx context.Context, c client.Client, namespace, name, lease string, held func(*coordinationv1.Lease) (string, bool)) (Others, error) {
	var deps appsv1.DeploymentList
	var pods corev1.PodList
	var leases coordinationv1.LeaseList
	for what, list := range map[string]client.ObjectList{"Deployments": &deps, "pods": &pods, "leases": &leases} {
		if err := c.List(ctx, list); err != nil {
			if apierrors.IsForbidden(err) {
				return Others{Why: fmt.Sprintf("may not list %s in every namespace (%v)", what, err)}, nil
			}
			return Others{}, fmt.Errorf("listing %s: %w", what, err)
		}
	}
	o := Others{Searched: true}
	ours := func(ns string, labels map[string]string) bool { return false }
	for i := range deps.Items {
		d := &deps.Items[i]
		if !liveowner.RunsGPUFleetOperator(&d.Spec.Template.Spec) {
			continue
		}
		if d.Namespace == namespace && d.Name == name {
			sel := d.Spec.Selector
			ours = func(ns string, labels map[string]string) bool {
				if ns != namespace || sel == nil {
					return false
				}
				for k, v := range sel.MatchLabels {
					if labels[k] != v {
						return false
					}
				}
				return true
			}
			continue
		}
		if r := ptr.Deref(d.Spec.Replicas, 1); r > 0 {
			o.Running = append(o.Running, fmt.Sprintf("Deployment %s/%s (%d replicas)", d.Namespace, d.Name, r))
		}
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || !liveowner.RunsGPUFleetOperator(&p.Spec) || ours(p.Namespace, p.Labels) {
			continue
		}
		o.Running = append(o.Running, fmt.Sprintf("pod %s/%s", p.Namespace, p.Name))
	}
	for i := range leases.Items {
		l := &leases.Items[i]
		if !strings.Contains(l.Name, "gpufleet") || (l.Namespace == namespace && l.Name == lease) {
			continue
		}
		if holder, ok := held(l); ok {
			o.Running = append(o.Running, fmt.Sprintf("lease %s/%s held by %s", l.Namespace, l.Name, holder))
		}
	}
	sort.Strings(o.Running)
	return o, nil
}
