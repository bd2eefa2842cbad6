// Package requestor is the requestor side of the maintenance engine: what a
// capability that needs a node for disruptive work (a driver upgrade, a
// reboot repair) does with NodeMaintenance objects. It builds the request,
// ensures it exists, reads it back and releases it, and maps an object back
// to the object that asked for it through its controller owner reference —
// never through a name. The scheduling limits, the cordon, the drain and the
// release of the node belong to the maintenance controllers; a requestor
// only asks and waits for Ready.
package requestor

import (
	"context"
	"fmt"
	"maps"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=nodemaintenances,verbs=get;list;watch;create;delete,namespace=gpufleet-system

// Request is what a requestor asks of the maintenance engine for one node.
type Request struct {
	// RequestorID names the requestor (spec.requestorID).
	RequestorID string
	// Namespace and Name of the NodeMaintenance.
	Namespace, Name string
	// NodeName is the node to hold.
	NodeName string
	// Owner is the object the maintenance is for (a NodeRepair, a
	// ClusterPolicy); it becomes the controller owner, so deleting the
	// owner releases the node through the maintenance finalizer.
	Owner client.Object
	// Cordon the node (nil = the API's default, true).
	Cordon *bool
	// Drain says how to drain the node (nil = no drain).
	Drain *maintenancev1.DrainSpec
	// WaitForPodCompletion (nil = no wait).
	WaitForPodCompletion *maintenancev1.WaitForPodCompletionSpec
	// AdditionalRequestors share the object.
	AdditionalRequestors []string
	// Labels to put on the object (e.g. which component asked).
	Labels map[string]string
	// Urgent marks the request urgent (annotation
	// maintenance.gpufleet.dev/urgent): it may start outside the maintenance
	// windows when its node is already unavailable; limits still apply.
	Urgent bool
}

// Object builds the NodeMaintenance of r. The scheme must know the owner's type.
func (r Request) Object(scheme *runtime.Scheme) (*maintenancev1.NodeMaintenance, error) {
	if r.RequestorID == "" || r.Name == "" || r.NodeName == "" {
		return nil, fmt.Errorf("maintenance request %s/%s: requestor, name and node are required", r.Namespace, r.Name)
	}
	nm := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name, Labels: maps.Clone(r.Labels)},
		Spec: maintenancev1.NodeMaintenanceSpec{
			RequestorID: r.RequestorID, NodeName: r.NodeName, Cordon: r.Cordon,
			DrainSpec: r.Drain.DeepCopy(), WaitForPodCompletion: r.WaitForPodCompletion.DeepCopy(),
			AdditionalRequestors: slices.Clone(r.AdditionalRequestors),
		},
	}
	if r.Urgent {
		nm.Annotations = map[string]string{maintenancev1.AnnotationUrgent: "true"}
	}
	if r.Owner != nil {
		if err := controllerutil.SetControllerReference(r.Owner, nm, scheme); err != nil {
			return nil, fmt.Errorf("maintenance request %s/%s: %w", r.Namespace, r.Name, err)
		}
		// Deleting the owner must not wait for the node's release (and the
		// requestor needs no right to set finalizers on its owner).
		nm.OwnerReferences[0].BlockOwnerDeletion = ptr.To(false)
	}
	return nm, nil
}

// Ensure creates the NodeMaintenance of r unless it exists, and returns it
// (the existing one when it was already there). Calling it again after a
// crash between the create and recording it is safe.
func Ensure(ctx context.Context, c client.Client, r Request) (*maintenancev1.NodeMaintenance, error) {
	nm, err := r.Object(c.Scheme())
	if err != nil {
		return nil, err
	}
	err = c.Create(ctx, nm)
	if apierrors.IsAlreadyExists(err) {
		existing := &maintenancev1.NodeMaintenance{}
		if gerr := c.Get(ctx, client.ObjectKeyFromObject(nm), existing); gerr != nil {
			return nil, fmt.Errorf("reading the maintenance of node %s: %w", r.NodeName, gerr)
		}
		if existing.Spec.NodeName != r.NodeName || existing.Spec.RequestorID != r.RequestorID {
			return nil, fmt.Errorf("NodeMaintenance %s/%s exists for node %s and requestor %s, not %s and %s",
				nm.Namespace, nm.Name, existing.Spec.NodeName, existing.Spec.RequestorID, r.NodeName, r.RequestorID)
		}
		return existing, nil
	}
	if err != nil {
		return nil, fmt.Errorf("requesting maintenance of node %s: %w", r.NodeName, err)
	}
	return nm, nil
}

// Get reads a requestor's NodeMaintenance; nil (and no error) when it is gone.
func Get(ctx context.Context, c client.Reader, namespace, name string) (*maintenancev1.NodeMaintenance, error) {
	nm := &maintenancev1.NodeMaintenance{}
	err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, nm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading NodeMaintenance %s/%s: %w", namespace, name, err)
	}
	return nm, nil
}

// Release deletes a requestor's NodeMaintenance: the maintenance finalizer
// then uncordons the node (unless it was cordoned before, or another
// maintenance holds it). Releasing what is already gone is not an error.
func Release(ctx context.Context, c client.Client, namespace, name string) error {
	nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if err := c.Delete(ctx, nm); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("releasing NodeMaintenance %s/%s: %w", namespace, name, err)
	}
	return nil
}

// Mine lists the requestor's objects in namespace that are not being
// deleted, by node.
func Mine(ctx context.Context, c client.Reader, namespace, requestorID string) (map[string]*maintenancev1.NodeMaintenance, error) {
	var list maintenancev1.NodeMaintenanceList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing NodeMaintenance: %w", err)
	}
	out := map[string]*maintenancev1.NodeMaintenance{}
	for i := range list.Items {
		nm := &list.Items[i]
		if nm.Spec.RequestorID == requestorID && nm.DeletionTimestamp == nil {
			out[nm.Spec.NodeName] = nm
		}
	}
	return out, nil
}

// OwnerOf returns the name of the object of ownerKind that asked for nm
// (its controller owner), or "".
func OwnerOf(nm *maintenancev1.NodeMaintenance, ownerKind string) string {
	if ref := metav1.GetControllerOf(nm); ref != nil && ref.Kind == ownerKind {
		return ref.Name
	}
	return ""
}

// EnqueueOwner maps a NodeMaintenance event to its controller owner of
// ownerType (cluster-scoped or in the object's namespace).
func EnqueueOwner(scheme *runtime.Scheme, mapper meta.RESTMapper, ownerType client.Object) handler.EventHandler {
	return handler.EnqueueRequestForOwner(scheme, mapper, ownerType, handler.OnlyControllerOwner())
}

// OfRequestor passes only the NodeMaintenance objects of requestorID.
func OfRequestor(requestorID string) predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		nm, ok := o.(*maintenancev1.NodeMaintenance)
		return ok && nm.Spec.RequestorID == requestorID
	})
}

// Transitions passes the NodeMaintenance changes a requestor waits for —
// creation, deletion, a phase change, Ready, DrainBlocked or the drain's
// timeout changing, a change of the spec (a requestor that asked for more)
// — and
// not the status churn of a drain in progress.
var Transitions = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, okO := e.ObjectOld.(*maintenancev1.NodeMaintenance)
		n, okN := e.ObjectNew.(*maintenancev1.NodeMaintenance)
		if !okO || !okN {
			return true
		}
		oHeld, oWhy := o.DrainHeld()
		nHeld, nWhy := n.DrainHeld()
		return o.Phase() != n.Phase() || o.IsReady() != n.IsReady() || o.DrainTimedOut() != n.DrainTimedOut() ||
			oHeld != nHeld || (nHeld && oWhy != nWhy) || o.Status.ObservedGeneration != n.Status.ObservedGeneration ||
			(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) ||
			(n.Phase() == maintenancev1.PhasePending && waitReason(o) != waitReason(n))
	},
}

// waitReason is why a Pending object waits (its Ready condition's message).
func waitReason(nm *maintenancev1.NodeMaintenance) string {
	if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady); c != nil {
		return c.Message
	}
	return ""
}
