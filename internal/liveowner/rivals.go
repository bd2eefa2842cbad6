package liveowner

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch

// Rivals finds what a lease alone does not show: NVIDIA's operator running
// without leader election (it never writes a lease, and acts all the same),
// and a second gpufleet operator installed in another namespace (its lease
// has another name or namespace). Both are found by their Deployments, in
// every namespace, with ready replicas. While one runs, gpufleet does not
// act on what it would act on too.
type Rivals struct {
	// Namespace is this gpufleet's: its own Deployment is there.
	Namespace string
	// Reader lists the Deployments (the cache NewRivals makes).
	Reader client.Reader
	// Cache is that cache, for watches (Source); nil: none.
	Cache cache.Cache
}

// Source is a watch of the Deployments that tells h when what Find sees
// may have changed: a Deployment created or deleted, its first replica
// ready or its last gone, its labels or its containers' command changed.
// Nil when there is no cache to watch.
func (r *Rivals) Source(h handler.EventHandler) source.Source {
	if r == nil || r.Cache == nil {
		return nil
	}
	return source.Kind[client.Object](r.Cache, &appsv1.Deployment{}, h, rivalChanged)
}

var rivalChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*appsv1.Deployment)
		n, ok2 := e.ObjectNew.(*appsv1.Deployment)
		if !ok1 || !ok2 {
			return true
		}
		return (o.Status.ReadyReplicas > 0) != (n.Status.ReadyReplicas > 0) ||
			!equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
			!equality.Semantic.DeepEqual(o.Spec.Template.Spec.Containers, n.Spec.Template.Spec.Containers)
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// RivalRecheck is when a gpufleet held back by a rival looks again anyway
// (the Deployments' events bring it back sooner).
const RivalRecheck = 30 * time.Second

// IsDeployment reports whether d is op's own Deployment, as their charts
// and kustomize name and label it: the GPU Operator's is named gpu-operator
// and labelled app=gpu-operator; the Maintenance Operator's is named after
// its release (maintenance-operator, or <release>-maintenance-operator) or
// maintenance-operator-controller-manager, labelled
// app.kubernetes.io/component=maintenance-operator-controller-manager.
func (op Operator) IsDeployment(d *appsv1.Deployment) bool {
	l := d.Labels
	switch op.Lease {
	case GPUOperator.Lease:
		return d.Name == "gpu-operator" || l["app"] == "gpu-operator" ||
			(l["app.kubernetes.io/component"] == "gpu-operator" && l["app.kubernetes.io/name"] == "gpu-operator")
	case MaintenanceOperator.Lease:
		return d.Name == "maintenance-operator" || d.Name == "maintenance-operator-controller-manager" ||
			l["app.kubernetes.io/component"] == "maintenance-operator-controller-manager"
	}
	return false
}

// electsALeader reports whether a Deployment's operator runs with leader
// election (controller-runtime's --leader-elect flag, as NVIDIA's charts
// set it): then its lease says whether it acts.
func electsALeader(spec *corev1.PodSpec) bool {
	for _, c := range spec.Containers {
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			switch a {
			case "--leader-elect", "--leader-elect=true", "-leader-elect", "--leader-elect=True":
				return true
			}
		}
	}
	return false
}

// Find says what of op, or of another gpufleet, runs where a lease cannot
// tell (false when nothing): a Deployment of op with ready replicas and
// without leader election; a gpufleet operator's Deployment with ready
// replicas outside this gpufleet's namespace. Nil Rivals: nothing looked at.
func (r *Rivals) Find(ctx context.Context, op Operator, now time.Time) (Holding, bool, error) {
	if r == nil || r.Reader == nil {
		return Holding{}, false, nil
	}
	var deps appsv1.DeploymentList
	if err := r.Reader.List(ctx, &deps); err != nil {
		return Holding{}, false, fmt.Errorf("listing Deployments for other operators: %w", err)
	}
	var found []string
	for i := range deps.Items {
		d := &deps.Items[i]
		if d.Status.ReadyReplicas == 0 {
			continue
		}
		switch {
		case op.IsDeployment(d) && !electsALeader(&d.Spec.Template.Spec):
			found = append(found, fmt.Sprintf("%s runs as Deployment %s/%s (%d ready) without leader election (no --leader-elect): no lease tells when it acts; scale it to 0",
				op.Name, d.Namespace, d.Name, d.Status.ReadyReplicas))
		case d.Namespace != r.Namespace && RunsGPUFleetOperator(&d.Spec.Template.Spec):
			found = append(found, fmt.Sprintf("another gpufleet operator runs as Deployment %s/%s (%d ready): two would act at once; remove one of them",
				d.Namespace, d.Name, d.Status.ReadyReplicas))
		}
	}
	if len(found) == 0 {
		return Holding{}, false, nil
	}
	sort.Strings(found)
	return Holding{Operator: op, Until: now.Add(RivalRecheck), Reason: strings.Join(found, "; ") + ": gpufleet does not act beside it"}, true, nil
}

// NewRivals is Rivals of namespace over a cache of every namespace's
// Deployments, each cut down to what Find reads (started with mgr).
func NewRivals(mgr manager.Manager, namespace string) (*Rivals, error) {
	c, err := cluster.New(mgr.GetConfig(), func(o *cluster.Options) {
		o.Scheme = mgr.GetScheme()
		o.HTTPClient = mgr.GetHTTPClient()
		o.MapperProvider = func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mgr.GetRESTMapper(), nil }
		o.Cache = cache.Options{ByObject: map[client.Object]cache.ByObject{&appsv1.Deployment{}: {Transform: trimDeployment}}}
	})
	if err != nil {
		return nil, fmt.Errorf("creating the cache of Deployments: %w", err)
	}
	if err := mgr.Add(c); err != nil {
		return nil, fmt.Errorf("adding the cache of Deployments: %w", err)
	}
	return &Rivals{Namespace: namespace, Reader: c.GetCache(), Cache: c.GetCache()}, nil
}

// trimDeployment keeps of a Deployment its name, labels, ready replicas
// and its containers' command and arguments.
func trimDeployment(obj any) (any, error) {
	d, ok := obj.(*appsv1.Deployment)
	if !ok {
		return obj, nil
	}
	out := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: d.Name, Labels: d.Labels,
		ResourceVersion: d.ResourceVersion, UID: d.UID}}
	out.Status.ReadyReplicas = d.Status.ReadyReplicas
	for _, c := range d.Spec.Template.Spec.Containers {
		out.Spec.Template.Spec.Containers = append(out.Spec.Template.Spec.Containers, corev1.Container{Name: c.Name, Command: c.Command, Args: c.Args})
	}
	return out, nil
}
