// Package takeover switches a cluster between NVIDIA's operators (the GPU
// Operator, the Maintenance Operator) and gpufleet, in either direction,
// without restarting what runs: the other operator is stopped first (its
// Deployment scaled to 0, its leader lease released), then the one taking
// over finds the objects as they are and continues from them. gpufleet's
// controllers do the adopting (internal/gpustack adopts the GPU Operator's
// DaemonSets; the maintenance controllers continue NodeMaintenance objects
// from their phase); this package decides and reports what that will do,
// and stops and starts the Deployments.
//
// MakePlan is pure: a Snapshot (one List per kind) in, a Plan out. Run
// reads the snapshot, prints the plan and, unless it is a dry run, acts.
package takeover

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpucluster"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// Operator names one of NVIDIA's operators gpufleet stands in for.
type Operator string

// The operators, as the command's --from and --to name them.
const (
	GPUOperator         Operator = "gpu-operator"
	MaintenanceOperator Operator = "maintenance-operator"
)

// ParseOperator reads a --from or --to value.
func ParseOperator(s string) (Operator, error) {
	switch o := Operator(s); o {
	case GPUOperator, MaintenanceOperator:
		return o, nil
	}
	return "", fmt.Errorf("unknown operator %q: want %s or %s", s, GPUOperator, MaintenanceOperator)
}

// owner is the operator's leader lease and how people know it.
func (o Operator) owner() liveowner.Operator {
	if o == MaintenanceOperator {
		return liveowner.MaintenanceOperator
	}
	return liveowner.GPUOperator
}

// IsDeployment reports whether d is the operator's own Deployment (found in
// any namespace), as its chart and kustomize name and label it.
func (o Operator) IsDeployment(d *appsv1.Deployment) bool {
	return o.owner().IsDeployment(d)
}

// Direction is what a takeover does: from the operator to gpufleet, or
// back (Back) from gpufleet to it.
type Direction struct {
	Operator Operator
	Back     bool
}

func (d Direction) String() string {
	if d.Back {
		return "--to " + string(d.Operator)
	}
	return "--from " + string(d.Operator)
}

// AnnotationScaledDownFrom on a Deployment a takeover scaled to 0 records
// its replicas before, so that the way back restores them.
const AnnotationScaledDownFrom = "gpufleet.dev/scaled-down-from"

// Snapshot is the cluster as a takeover sees it, read with one List per
// kind.
type Snapshot struct {
	// Namespace is gpufleet's; OwnDeployment names its Deployment there,
	// and its leader lease (the chart and kustomize use the same name).
	Namespace, OwnDeployment string
	Now                      time.Time
	// Deployments and Leases of every namespace.
	Deployments []appsv1.Deployment
	Leases      []coordinationv1.Lease
	// For the GPU Operator: the ClusterPolicies, the NVIDIADrivers, the
	// nodes, and the DaemonSets and pods of the stack's namespace
	// (StackNamespace).
	Policies      []nvidiav1.ClusterPolicy
	NVIDIADrivers []nvidiav1alpha1.NVIDIADriver
	// GPUClusters: the GPU Operator's DRA stack (at most one).
	GPUClusters []nvidiav1alpha1.GPUCluster
	Nodes       []corev1.Node
	DaemonSets  []appsv1.DaemonSet
	Pods        []corev1.Pod
	// For the Maintenance Operator: every NodeMaintenance.
	NodeMaintenances []maintenancev1.NodeMaintenance
}

// StackNamespace is where the running stack is: the status.namespace (the
// GPU Operator's namespace) of the GPUCluster that runs, else of the
// active ClusterPolicy, else gpufleet's namespace.
func (s Snapshot) StackNamespace() string {
	if gc := runningGPUCluster(s); gc != nil {
		return cmp.Or(gc.Status.Namespace, s.Namespace)
	}
	if p := gpustack.OldestPolicy(s.Policies); p != nil && p.Status.Namespace != "" {
		return p.Status.Namespace
	}
	return s.Namespace
}

// runningGPUCluster is the GPUCluster whose stack runs (nil: none): one
// not being deleted and not held by an older ClusterPolicy (gpufleet runs
// whichever of the two came first).
func runningGPUCluster(s Snapshot) *nvidiav1alpha1.GPUCluster {
	for i := range s.GPUClusters {
		gc := &s.GPUClusters[i]
		if gc.DeletionTimestamp == nil && gpucluster.BlockingPolicy(gc, s.Policies) == nil {
			return gc
		}
	}
	return nil
}

// Workload is a Deployment a takeover stops or starts.
type Workload struct {
	Namespace, Name string
	Replicas        int32
	// ScaledDownFrom: the replicas recorded when a takeover scaled it to 0.
	ScaledDownFrom int32
	// HelmRelease: the Helm release that manages it ("" none).
	HelmRelease string
}

func (w Workload) String() string { return "Deployment " + w.Namespace + "/" + w.Name }

// ScaleCommand is the kubectl command that scales it.
func (w Workload) ScaleCommand(replicas int32) string {
	return fmt.Sprintf("kubectl -n %s scale deployment %s --replicas=%d", w.Namespace, w.Name, replicas)
}

// RestoreReplicas is what starting it again scales it to: its replicas
// before a takeover stopped it, else 1.
func (w Workload) RestoreReplicas() int32 {
	if w.ScaledDownFrom > 0 {
		return w.ScaledDownFrom
	}
	return 1
}

// DaemonSet is one workload of the stack (a DaemonSet, or the DRA
// driver's controller Deployment) and what the takeover does to its pods.
type DaemonSet struct {
	// Kind is "" for a DaemonSet, else the workload's kind.
	Kind            string
	Component, Name string
	Pods            int
	// Why its pods restart ("" they do not).
	Why string
}

// InFlight is a NodeMaintenance the operator taking over continues.
type InFlight struct {
	Key             client.ObjectKey
	Node, Requestor string
	Phase           maintenancev1.Phase
	Finalizers      []string
	Deleting        bool
}

// Plan is what a takeover finds and does.
type Plan struct {
	Direction Direction
	// Operator is the other operator (name and lease).
	Operator liveowner.Operator
	// Stop: the Deployments stopped first (the other operator's, or
	// gpufleet's on the way back); StopLease: who holds the lease of what
	// is stopped (nil: free).
	Stop      []Workload
	StopLease *liveowner.Holding
	// Start: the Deployments scaled up once the others stopped (0
	// replicas now: the other operator's on the way back, gpufleet's if a
	// takeover stopped it).
	Start []Workload
	// Own is gpufleet's Deployment (nil: not found).
	Own *Workload
	// Policy and StackNamespace: the active ClusterPolicy and where its
	// stack runs (GPU Operator only); GPUCluster instead of Policy when a
	// GPUCluster's DRA stack runs.
	Policy, GPUCluster, StackNamespace string
	// Adopted: DaemonSets taken over with their pods; Restarts: those
	// whose pods are replaced; New: DaemonSets gpufleet creates (no
	// running counterpart); Blocked: components not deployed.
	Adopted, Restarts []DaemonSet
	New, Blocked      []string
	// InFlight: the NodeMaintenance objects the operator taking over
	// continues, in lifecycle order.
	InFlight []InFlight
	// Notes: what to know; Problems: why the takeover must not go on.
	Notes, Problems []string
}

// MakePlan decides the takeover d of the cluster s.
func MakePlan(s Snapshot, d Direction) Plan {
	p := Plan{Direction: d, Operator: d.Operator.owner()}
	var others, fleets []Workload
	for i := range s.Deployments {
		dep := &s.Deployments[i]
		switch {
		case d.Operator.IsDeployment(dep):
			others = append(others, workload(dep))
		case dep.Namespace == s.Namespace && dep.Name == s.OwnDeployment:
			w := workload(dep)
			p.Own = &w
		case liveowner.RunsGPUFleetOperator(&dep.Spec.Template.Spec):
			fleets = append(fleets, workload(dep))
		}
	}
	// gpufleet's operator under another name or namespace: with the named
	// one missing, the user named the wrong one; beside it, two gpufleets
	// would act at once.
	for _, w := range running(fleets) {
		if p.Own == nil {
			p.Problems = append(p.Problems, fmt.Sprintf("gpufleet's operator runs as %s (%d replicas): name it with -n %s --deployment %s",
				w, w.Replicas, w.Namespace, w.Name))
		} else {
			p.Problems = append(p.Problems, fmt.Sprintf("another gpufleet operator runs as %s (%d replicas): two would act at once; remove one first",
				w, w.Replicas))
		}
	}
	held, otherRuns := liveowner.Held(s.Leases, p.Operator, s.Now)
	own := liveowner.Operator{Name: "gpufleet", Lease: s.OwnDeployment}
	ownHeld, ownRuns := liveowner.Held(namespaced(s.Leases, s.Namespace), own, s.Now)
	if p.Own == nil {
		p.Problems = append(p.Problems, fmt.Sprintf("gpufleet's Deployment %s/%s was not found: install gpufleet (or name its namespace with -n)",
			s.Namespace, s.OwnDeployment))
	}
	if !d.Back {
		p.Stop = running(others)
		if otherRuns {
			p.StopLease = &held
		}
		if len(others) == 0 {
			if otherRuns {
				p.Problems = append(p.Problems, fmt.Sprintf("%s holds its lease %s/%s (holder %s) but no Deployment of it was found: stop it yourself, then run this again",
					p.Operator.Name, held.Namespace, p.Operator.Lease, held.Holder))
			} else {
				p.Notes = append(p.Notes, fmt.Sprintf("no Deployment of %s found and its lease is free: nothing to stop", p.Operator.Name))
			}
		}
		if p.Own != nil && p.Own.Replicas == 0 {
			p.Start = append(p.Start, *p.Own)
		}
	} else {
		if p.Own != nil && p.Own.Replicas > 0 {
			p.Stop = append(p.Stop, *p.Own)
		}
		if ownRuns {
			p.StopLease = &ownHeld
		}
		for _, w := range others {
			if w.Replicas == 0 {
				p.Start = append(p.Start, w)
			}
		}
		if len(others) == 0 {
			p.Problems = append(p.Problems, fmt.Sprintf("no Deployment of %s found: install it (it finds the objects as gpufleet leaves them), then run this again", p.Operator.Name))
		}
	}
	for _, w := range others {
		if w.HelmRelease != "" {
			p.Notes = append(p.Notes, helmNote(d, w))
		}
	}
	switch d.Operator {
	case GPUOperator:
		planGPUStack(&p, s)
	case MaintenanceOperator:
		p.InFlight = inFlight(s.NodeMaintenances)
		if d.Back {
			p.Notes = append(p.Notes, "gpufleet stops as a whole (every controller of its Deployment), not only its maintenance controllers")
		}
	}
	return p
}

func workload(d *appsv1.Deployment) Workload {
	w := Workload{Namespace: d.Namespace, Name: d.Name, Replicas: ptr.Deref(d.Spec.Replicas, 1)}
	if n, err := strconv.ParseInt(d.Annotations[AnnotationScaledDownFrom], 10, 32); err == nil && n > 0 {
		w.ScaledDownFrom = int32(n)
	}
	if d.Labels["app.kubernetes.io/managed-by"] == "Helm" {
		w.HelmRelease = cmp.Or(d.Annotations["meta.helm.sh/release-name"], d.Labels["app.kubernetes.io/instance"], d.Name)
	}
	return w
}

// running are the workloads with replicas, sorted; one already at 0 is
// stopped (its lease says whether its pod still runs).
func running(ws []Workload) []Workload {
	var out []Workload
	for _, w := range ws {
		if w.Replicas > 0 {
			out = append(out, w)
		}
	}
	return out
}

func namespaced(leases []coordinationv1.Lease, ns string) []coordinationv1.Lease {
	var out []coordinationv1.Lease
	for _, l := range leases {
		if l.Namespace == ns {
			out = append(out, l)
		}
	}
	return out
}

// helmNote says what a Helm release of the other operator does later.
func helmNote(d Direction, w Workload) string {
	if d.Back {
		return fmt.Sprintf("%s belongs to Helm release %s: scaling it is enough; a later helm upgrade keeps it running", w, w.HelmRelease)
	}
	if d.Operator == GPUOperator {
		return fmt.Sprintf("%s belongs to Helm release %s: do not helm upgrade it (that scales it back to 1, and its pre-upgrade hook puts "+
			"NVIDIA's CRD schemas back over gpufleet's); if you must, run helm upgrade %s <chart> -n %s --reuse-values --no-hooks "+
			"--set operator.upgradeCRD=false, then scale it to 0 again. Do not helm uninstall it either: the ClusterPolicy it "+
			"created would be deleted, and with it the DaemonSets it owns",
			w, w.HelmRelease, w.HelmRelease, w.Namespace)
	}
	return fmt.Sprintf("%s belongs to Helm release %s: a later helm upgrade of it scales it back to 1; scale it to 0 again after one", w, w.HelmRelease)
}

// planGPUStack adds the ClusterPolicy's stack: which of the GPU
// Operator's DaemonSets gpufleet adopts, and whose pods restart (or, on
// the way back, what the GPU Operator finds).
func planGPUStack(p *Plan, s Snapshot) {
	if gc := runningGPUCluster(s); gc != nil {
		planGPUCluster(p, s, gc)
		return
	}
	policy := gpustack.OldestPolicy(s.Policies)
	if policy == nil {
		p.Notes = append(p.Notes, "no ClusterPolicy and no GPUCluster: the GPU Operator runs no stack, nothing to adopt")
		return
	}
	for _, gc := range s.GPUClusters {
		p.Notes = append(p.Notes, fmt.Sprintf("GPUCluster %s was created after ClusterPolicy %s: gpufleet deploys nothing of it while the ClusterPolicy exists "+
			"(the device plugin and the DRA driver would offer the same GPUs twice)", gc.Name, policy.Name))
	}
	p.Policy = policy.Name
	p.StackNamespace = s.StackNamespace()
	if p.StackNamespace != s.Namespace && policy.Annotations[gpustack.AnnotationOtherNamespaceCleared] != p.StackNamespace && !p.Direction.Back {
		p.Problems = append(p.Problems, fmt.Sprintf("the stack runs in namespace %s (ClusterPolicy %s status.namespace) and gpufleet in %s: "+
			"gpufleet would not deploy beside it; install gpufleet into namespace %s, so that it adopts the stack without restarting it",
			p.StackNamespace, policy.Name, s.Namespace, p.StackNamespace))
	}
	pods := podsByDaemonSet(s.Pods)
	if p.Direction.Back {
		planHandBack(p, daemonSetObjects(s.DaemonSets), func(o client.Object) int { return len(pods[o.GetName()]) })
		return
	}
	nodes := &corev1.NodeList{Items: s.Nodes}
	facts := gpustack.FactsOf(nodes, p.StackNamespace, policy.Spec.Operator.DefaultRuntime)
	if policy.Spec.Driver.UseNvidiaDriverCRD != nil && *policy.Spec.Driver.UseNvidiaDriverCRD {
		facts.Drivers = s.NVIDIADrivers
	}
	rendered, err := gpustack.Render(policy, facts, gpustack.Assets)
	if err != nil {
		p.Problems = append(p.Problems, fmt.Sprintf("gpufleet cannot render ClusterPolicy %s: %v", policy.Name, err))
		return
	}
	objs, adoptions, blocked := gpustack.Adopt(rendered, s.DaemonSets)
	live := map[string]*appsv1.DaemonSet{}
	for i := range s.DaemonSets {
		live[s.DaemonSets[i].Name] = &s.DaemonSets[i]
	}
	adopted := map[string]bool{}
	for _, a := range adoptions {
		adopted[a.Live] = true
	}
	for _, o := range objs {
		want, ok := o.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		have := live[want.Name]
		c := want.Labels[gpustack.LabelComponent]
		switch {
		case have == nil:
			p.New = append(p.New, fmt.Sprintf("%s (%s): no DaemonSet runs it, gpufleet creates one", want.Name, c))
			continue
		case !adopted[want.Name]:
			continue // gpufleet's own already
		}
		ds := DaemonSet{Component: c, Name: have.Name, Pods: len(pods[have.Name])}
		ds.Why = restartReason(want, have, pods[have.Name])
		if ds.Why == "" {
			p.Adopted = append(p.Adopted, ds)
		} else {
			p.Restarts = append(p.Restarts, ds)
		}
	}
	for _, b := range blocked {
		p.Blocked = append(p.Blocked, b.String())
		p.Problems = append(p.Problems, fmt.Sprintf("component %s is blocked: gpufleet would leave the GPU Operator's DaemonSet %s unmanaged "+
			"(remove the extra DaemonSets, or keep only one OS flavour)", b.Component, strings.Join(b.Live, ", ")))
	}
}

// restartReason says why adopting have as want restarts its pods ("" it
// does not): the template is replaced (another image), or pods still run
// another image than the policy's.
func restartReason(want, have *appsv1.DaemonSet, pods []corev1.Pod) string {
	how := "rolling update (the DaemonSet's update strategy)"
	if want.Labels[gpustack.LabelComponent] == gpustack.Driver {
		how = "replaced node by node through NodeMaintenance (cordon, drain, new driver pod)"
	}
	return templateRestart(&want.Spec.Template, &have.Spec.Template, gpustack.LiveTemplateKept(want, have), pods, how)
}

// templateRestart says why taking over a workload restarts its pods ("" it
// does not): its template is replaced (kept false), or some of its pods
// still run another image than want's.
func templateRestart(want, have *corev1.PodTemplateSpec, kept bool, pods []corev1.Pod, how string) string {
	if !kept {
		return "restarts: " + imageChange(want.Spec.Containers, have.Spec.Containers) + "; " + how
	}
	stale := map[string]int{}
	for _, pod := range pods {
		for _, w := range want.Spec.Containers {
			i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == w.Name })
			if i >= 0 && pod.Spec.Containers[i].Image != w.Image {
				stale[pod.Spec.Containers[i].Image+" → "+w.Image]++
				break
			}
		}
	}
	if len(stale) == 0 {
		return ""
	}
	var parts []string
	for _, change := range sortedKeys(stale) {
		parts = append(parts, fmt.Sprintf("%d pods run image %s", stale[change], change))
	}
	return "restarts: " + strings.Join(parts, ", ") + "; " + how
}

// imageChange names the containers whose image differs.
func imageChange(want, have []corev1.Container) string {
	var parts []string
	for _, w := range want {
		i := slices.IndexFunc(have, func(h corev1.Container) bool { return h.Name == w.Name })
		switch {
		case i < 0:
			parts = append(parts, "container "+w.Name+" added")
		case have[i].Image != w.Image:
			parts = append(parts, "image "+have[i].Image+" → "+w.Image)
		}
	}
	if len(parts) == 0 {
		return "pod template replaced"
	}
	return strings.Join(slices.Compact(parts), ", ")
}

// planHandBack: what the GPU Operator finds on the way back. Adopted
// DaemonSets have no hash annotation: it rewrites each from its own
// template; one whose template gpufleet kept is the GPU Operator's own
// (no restart, unless the policy changed since), one gpufleet replaced
// restarts. A DaemonSet gpufleet created would run beside the GPU
// Operator's own: a problem. workloads are the stack namespace's
// DaemonSets (and, for a GPUCluster, its controller Deployment).
func planHandBack(p *Plan, workloads []client.Object, pods func(client.Object) int) {
	for _, w := range workloads {
		if w.GetLabels()[gpustack.LabelManagedBy] != "gpufleet" || w.GetDeletionTimestamp() != nil {
			continue
		}
		kind, c := gpucluster.Kind(w), w.GetLabels()[gpustack.LabelComponent]
		ref := fmt.Sprintf("%s %s/%s", kind, w.GetNamespace(), w.GetName())
		if w.GetAnnotations()[gpustack.AnnotationAdoptedFrom] == "" {
			p.Problems = append(p.Problems, fmt.Sprintf("%s (%s) was created by gpufleet: the GPU Operator would start its own beside it; "+
				"delete it first (kubectl -n %s delete %s %s; its pods stop)", ref, c, w.GetNamespace(), strings.ToLower(kind), w.GetName()))
			continue
		}
		d := DaemonSet{Component: c, Name: w.GetName(), Pods: pods(w)}
		if kind != "DaemonSet" {
			d.Kind = kind
		}
		if w.GetAnnotations()[gpustack.AnnotationAcceptedTemplate] == "" {
			d.Why = "restarts: gpufleet replaced its pod template (the spec changed); the GPU Operator rewrites it from its own template"
			p.Restarts = append(p.Restarts, d)
			continue
		}
		p.Adopted = append(p.Adopted, d)
	}
	if len(p.Adopted) > 0 {
		p.Notes = append(p.Notes, "the GPU Operator finds its DaemonSets without its hash annotation (nvidia.com/last-applied-hash) and rewrites each "+
			"from its own template: their templates are still its own, so nothing restarts unless the ClusterPolicy or GPUCluster changed meanwhile")
	}
}

// daemonSetObjects are dss as objects, for planHandBack.
func daemonSetObjects(dss []appsv1.DaemonSet) []client.Object {
	out := make([]client.Object, 0, len(dss))
	for i := range dss {
		out = append(out, &dss[i])
	}
	return out
}

// planGPUCluster adds the GPUCluster's DRA stack: which of the GPU
// Operator's workloads gpufleet takes over (same name; the live selector
// and, while it runs the images the GPUCluster asks for, the live pod
// template are kept) and whose pods restart, or on the way back what the
// GPU Operator finds.
func planGPUCluster(p *Plan, s Snapshot, gc *nvidiav1alpha1.GPUCluster) {
	p.GPUCluster = gc.Name
	p.StackNamespace = s.StackNamespace()
	for _, pol := range s.Policies {
		p.Notes = append(p.Notes, fmt.Sprintf("ClusterPolicy %s was created after GPUCluster %s: gpufleet deploys nothing of it while the GPUCluster exists "+
			"(reason GPUClusterPresent; the device plugin and the DRA driver would offer the same GPUs twice)", pol.Name, gc.Name))
	}
	if p.StackNamespace != s.Namespace && gc.Annotations[gpustack.AnnotationOtherNamespaceCleared] != p.StackNamespace && !p.Direction.Back {
		p.Problems = append(p.Problems, fmt.Sprintf("the DRA stack runs in namespace %s (GPUCluster %s status.namespace) and gpufleet in %s: "+
			"gpufleet would not deploy beside it; install gpufleet into namespace %s, so that it takes the stack over without restarting it",
			p.StackNamespace, gc.Name, s.Namespace, p.StackNamespace))
	}
	deployments := map[string]*appsv1.Deployment{}
	for i := range s.Deployments {
		if d := &s.Deployments[i]; d.Namespace == p.StackNamespace {
			deployments[d.Name] = d
		}
	}
	byDaemonSet := podsByDaemonSet(s.Pods)
	pods := func(o client.Object) []corev1.Pod {
		switch w := o.(type) {
		case *appsv1.DaemonSet:
			return byDaemonSet[w.Name]
		case *appsv1.Deployment:
			return podsSelected(s.Pods, w.Spec.Selector)
		}
		return nil
	}
	if p.Direction.Back {
		workloads := daemonSetObjects(s.DaemonSets)
		if d := deployments[gpucluster.Controller]; d != nil {
			workloads = append(workloads, d)
		}
		planHandBack(p, workloads, func(o client.Object) int { return len(pods(o)) })
		return
	}
	rendered, err := gpucluster.Render(gc, p.StackNamespace)
	if err != nil {
		p.Problems = append(p.Problems, fmt.Sprintf("gpufleet cannot render GPUCluster %s: %v", gc.Name, err))
		return
	}
	live := map[string]*appsv1.DaemonSet{}
	for i := range s.DaemonSets {
		live[s.DaemonSets[i].Name] = &s.DaemonSets[i]
	}
	for _, want := range rendered {
		var have client.Object
		var wantTpl, haveTpl *corev1.PodTemplateSpec
		how := "rolling update (the DaemonSet's update strategy)"
		switch w := want.(type) {
		case *appsv1.DaemonSet:
			if h := live[w.Name]; h != nil {
				have, wantTpl, haveTpl = h, &w.Spec.Template, &h.Spec.Template
			}
		case *appsv1.Deployment:
			how = "rolling update (the Deployment's strategy)"
			if h := deployments[w.Name]; h != nil {
				have, wantTpl, haveTpl = h, &w.Spec.Template, &h.Spec.Template
			}
		default:
			continue
		}
		kind := gpucluster.Kind(want)
		switch {
		case have == nil:
			p.New = append(p.New, fmt.Sprintf("%s (%s): none runs it, gpufleet creates it", want.GetName(), kind))
			continue
		case have.GetLabels()[gpustack.LabelManagedBy] == "gpufleet":
			continue // gpufleet's own already
		}
		d := DaemonSet{Component: want.GetLabels()[gpustack.LabelComponent], Name: have.GetName(), Pods: len(pods(have))}
		if kind != "DaemonSet" {
			d.Kind = kind
		}
		d.Why = templateRestart(wantTpl, haveTpl, gpucluster.KeepsLiveTemplate(want, have), pods(have), how)
		if d.Why == "" {
			p.Adopted = append(p.Adopted, d)
		} else {
			p.Restarts = append(p.Restarts, d)
		}
	}
	p.Notes = append(p.Notes, "the DRA driver's ServiceAccounts, RBAC, DeviceClasses, Services and ResourceClaimTemplates of the same names are "+
		"updated in place (no pod restarts); the GPU Operator's DRA validator DaemonSet is not deployed by gpufleet and is left as it is")
}

// podsSelected are the pods (not being deleted) that sel selects.
func podsSelected(pods []corev1.Pod, sel *metav1.LabelSelector) []corev1.Pod {
	selector, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || sel == nil {
		return nil
	}
	var out []corev1.Pod
	for _, pod := range pods {
		if pod.DeletionTimestamp == nil && selector.Matches(labels.Set(pod.Labels)) {
			out = append(out, pod)
		}
	}
	return out
}

func podsByDaemonSet(pods []corev1.Pod) map[string][]corev1.Pod {
	out := map[string][]corev1.Pod{}
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil {
			continue
		}
		for _, ref := range pod.OwnerReferences {
			if ref.Kind == "DaemonSet" && ptr.Deref(ref.Controller, false) {
				out[ref.Name] = append(out[ref.Name], pod)
			}
		}
	}
	return out
}

// phaseOrder is the lifecycle order of the phases, for the report.
var phaseOrder = []maintenancev1.Phase{
	maintenancev1.PhasePending, maintenancev1.PhaseScheduled, maintenancev1.PhaseCordon, maintenancev1.PhaseWaitForPodCompletion,
	maintenancev1.PhaseDraining, maintenancev1.PhaseReady, maintenancev1.PhaseRequestorFailed,
}

// inFlight lists the NodeMaintenance objects by phase, then name.
func inFlight(nms []maintenancev1.NodeMaintenance) []InFlight {
	out := make([]InFlight, 0, len(nms))
	for i := range nms {
		nm := &nms[i]
		out = append(out, InFlight{Key: client.ObjectKeyFromObject(nm), Node: nm.Spec.NodeName, Requestor: nm.Spec.RequestorID,
			Phase: nm.Phase(), Finalizers: slices.Clone(nm.Finalizers), Deleting: nm.DeletionTimestamp != nil})
	}
	rank := func(ph maintenancev1.Phase) int {
		if i := slices.Index(phaseOrder, ph); i >= 0 {
			return i
		}
		return len(phaseOrder)
	}
	slices.SortFunc(out, func(a, b InFlight) int {
		return cmp.Or(cmp.Compare(rank(a.Phase), rank(b.Phase)), strings.Compare(a.Key.String(), b.Key.String()))
	})
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
