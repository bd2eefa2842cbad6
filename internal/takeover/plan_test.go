package takeover

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/gpucluster"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

var update = flag.Bool("update", false, "rewrite the golden reports in testdata/")

var now = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

const stackNS = "gpu-operator"

func chartDefaultPolicy(t *testing.T) *nvidiav1.ClusterPolicy {
	t.Helper()
	data, err := os.ReadFile("../gpustack/testdata/clusterpolicy-chart-default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := &nvidiav1.ClusterPolicy{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		t.Fatal(err)
	}
	p.UID = "policy-uid"
	p.Status.Namespace = stackNS
	return p
}

// gpuNode is a GPU node of the GPU Operator running osID osVersion.
func gpuNode(name, osID, osVersion string) corev1.Node {
	return *testobj.Node(name, testobj.Labels(devcluster.GPUOperatorNodeLabels(false)), testobj.Labels(map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true",
		"feature.node.kubernetes.io/system-os_release.ID": osID, "feature.node.kubernetes.io/system-os_release.VERSION_ID": osVersion}),
		testobj.RuntimeVersion("containerd://1.7.24"))
}

func deployment(ns, name string, replicas int32, labels map[string]string) appsv1.Deployment {
	return appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas)}}
}

var gpuOperatorHelmLabels = map[string]string{"app": "gpu-operator", "app.kubernetes.io/component": "gpu-operator",
	"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "gpu-operator"}

func lease(ns, name, holder string) coordinationv1.Lease {
	renewed := metav1.NewMicroTime(now.Add(-5 * time.Second))
	return coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &renewed}}
}

// stack is the GPU Operator's converged stack on nodes for the policy,
// with images overriding the policy's, and one pod per DaemonSet and
// node (mig-manager on none: no node is MIG-capable).
func stack(t *testing.T, p *nvidiav1.ClusterPolicy, nodes []corev1.Node, images map[string]string) ([]appsv1.DaemonSet, []corev1.Pod) {
	t.Helper()
	facts := gpustack.FactsOf(&corev1.NodeList{Items: nodes}, stackNS, "")
	objs, err := gpustack.Render(p, facts, gpustack.Assets)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			want[ds.Labels[gpustack.LabelComponent]] = ds.Spec.Template.Spec.Containers[0].Image
		}
	}
	maps.Copy(want, images)
	s := devcluster.GPUOperatorStack{Namespace: stackNS, Images: want, ChartVersion: "v26.7.0",
		Owner: *metav1.NewControllerRef(p, nvidiav1.GroupVersion.WithKind("ClusterPolicy"))}
	var dss []appsv1.DaemonSet
	var pods []corev1.Pod
	for _, o := range s.Objects() {
		ds, ok := o.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		dss = append(dss, *ds)
		if ds.Name == "nvidia-mig-manager" {
			continue
		}
		for _, n := range nodes {
			pods = append(pods, corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: stackNS, Name: ds.Name + "-" + n.Name, Labels: ds.Spec.Template.Labels,
					OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}},
				Spec: *ds.Spec.Template.Spec.DeepCopy(),
			})
		}
	}
	return dss, pods
}

// adoptedBy makes dss what gpufleet leaves after adopting them: its
// labels, the adopted-from annotation, the hash annotation removed, the
// template accepted (unless replaced names it).
func adoptedBy(dss []appsv1.DaemonSet, replaced string) []appsv1.DaemonSet {
	out := make([]appsv1.DaemonSet, 0, len(dss))
	for _, ds := range dss {
		ds := *ds.DeepCopy()
		ds.Labels[gpustack.LabelManagedBy] = "gpufleet"
		ds.Labels[gpustack.LabelComponent] = componentOf[ds.Name]
		delete(ds.Annotations, gpustack.AnnotationPreviousHash)
		ds.Annotations[gpustack.AnnotationAdoptedFrom] = "gpu-operator"
		if ds.Name != replaced {
			ds.Annotations[gpustack.AnnotationAcceptedTemplate] = "0123456789abcdef"
		}
		out = append(out, ds)
	}
	return out
}

// draStack is the GPU Operator's DRA stack for the GPUCluster as it leaves
// it (its labels, its hash annotation, no gpufleet bookkeeping; the
// workloads' names and selectors as gpufleet renders them, which are the
// GPU Operator's), with images overriding the GPUCluster's by workload
// name, and a pod per node of each DaemonSet plus the controller's pod.
func draStack(t *testing.T, gc *nvidiav1alpha1.GPUCluster, nodes []corev1.Node, images map[string]string) ([]appsv1.DaemonSet, appsv1.Deployment, []corev1.Pod) {
	t.Helper()
	objs, err := gpucluster.Render(gc, stackNS)
	if err != nil {
		t.Fatal(err)
	}
	theirs := func(m *metav1.ObjectMeta, tpl *corev1.PodTemplateSpec) {
		m.Labels = map[string]string{"app.kubernetes.io/name": "nvidia-dra-driver", "app.kubernetes.io/component": m.Name, "app": m.Name,
			"nvidia.com/gpu-operator.state": "state-dra-driver"}
		m.Annotations = map[string]string{gpustack.AnnotationPreviousHash: "7f3c2a91"}
		m.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(gc, nvidiav1alpha1.GroupVersion.WithKind("GPUCluster"))}
		tpl.Labels = map[string]string{"app.kubernetes.io/name": "nvidia-dra-driver", "app.kubernetes.io/component": m.Name, "app": m.Name}
		if img, ok := images[m.Name]; ok {
			for i := range tpl.Spec.Containers {
				tpl.Spec.Containers[i].Image = img
			}
		}
	}
	var dss []appsv1.DaemonSet
	var ctl appsv1.Deployment
	var pods []corev1.Pod
	pod := func(name string, tpl *corev1.PodTemplateSpec, owner metav1.OwnerReference) {
		pods = append(pods, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: stackNS, Name: name, Labels: tpl.Labels,
			OwnerReferences: []metav1.OwnerReference{owner}}, Spec: *tpl.Spec.DeepCopy()})
	}
	for _, o := range objs {
		switch w := o.(type) {
		case *appsv1.DaemonSet:
			ds := *w.DeepCopy()
			theirs(&ds.ObjectMeta, &ds.Spec.Template)
			dss = append(dss, ds)
			for _, n := range nodes {
				pod(ds.Name+"-"+n.Name, &ds.Spec.Template, *metav1.NewControllerRef(&ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet")))
			}
		case *appsv1.Deployment:
			ctl = *w.DeepCopy()
			theirs(&ctl.ObjectMeta, &ctl.Spec.Template)
			pod(ctl.Name+"-6d4c9b7f5-q8x2z", &ctl.Spec.Template, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet",
				Name: ctl.Name + "-6d4c9b7f5", UID: "rs-uid", Controller: ptr.To(true)})
		}
	}
	return dss, ctl, pods
}

func chartDefaultGPUCluster(t *testing.T, created time.Time) *nvidiav1alpha1.GPUCluster {
	t.Helper()
	data, err := os.ReadFile("../gpucluster/testdata/gpucluster-chart-default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	gc := &nvidiav1alpha1.GPUCluster{}
	if err := yaml.UnmarshalStrict(data, gc); err != nil {
		t.Fatal(err)
	}
	gc.UID, gc.CreationTimestamp = "gpucluster-uid", metav1.NewTime(created)
	gc.Status.Namespace = stackNS
	return gc
}

// adoptedWorkloads makes the DRA stack what gpufleet leaves after taking
// it over (its labels and bookkeeping; replaced names the workload whose
// template gpufleet replaced).
func adoptedWorkloads(dss []appsv1.DaemonSet, ctl appsv1.Deployment, replaced string) ([]appsv1.DaemonSet, appsv1.Deployment) {
	mark := func(m *metav1.ObjectMeta) {
		m.Labels[gpustack.LabelManagedBy] = "gpufleet"
		m.Labels[gpustack.LabelComponent] = m.Name
		delete(m.Annotations, gpustack.AnnotationPreviousHash)
		m.Annotations[gpustack.AnnotationAdoptedFrom] = "gpu-operator"
		if m.Name != replaced {
			m.Annotations[gpustack.AnnotationAcceptedTemplate] = "fedcba9876543210"
		}
	}
	out := make([]appsv1.DaemonSet, 0, len(dss))
	for _, ds := range dss {
		ds := *ds.DeepCopy()
		mark(&ds.ObjectMeta)
		out = append(out, ds)
	}
	ctl = *ctl.DeepCopy()
	mark(&ctl.ObjectMeta)
	return out, ctl
}

var componentOf = map[string]string{}

func init() {
	for c, name := range devcluster.GPUOperatorDaemonSetNames() {
		componentOf[name] = c
	}
}

// summary is what a case checks besides its golden report.
type summary struct {
	Stop, Start       []string
	LeaseHeld         bool
	Adopted, Restarts []string
	New, Blocked      int
	InFlight          []string
	Problems          int
}

func summarize(p Plan) summary {
	s := summary{LeaseHeld: p.StopLease != nil, New: len(p.New), Blocked: len(p.Blocked), Problems: len(p.Problems)}
	for _, w := range p.Stop {
		s.Stop = append(s.Stop, w.Namespace+"/"+w.Name)
	}
	for _, w := range p.Start {
		s.Start = append(s.Start, fmt.Sprintf("%s/%s=%d", w.Namespace, w.Name, w.RestoreReplicas()))
	}
	for _, d := range p.Adopted {
		s.Adopted = append(s.Adopted, d.Name)
	}
	for _, d := range p.Restarts {
		s.Restarts = append(s.Restarts, d.Name)
	}
	for _, f := range p.InFlight {
		s.InFlight = append(s.InFlight, string(f.Phase)+" "+f.Key.Name)
	}
	return s
}

var allAdopted = []string{"nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset", "nvidia-device-plugin-daemonset",
	"nvidia-operator-validator", "nvidia-dcgm-exporter", "gpu-feature-discovery", "nvidia-mig-manager"}

func TestMakePlan(t *testing.T) {
	p := chartDefaultPolicy(t)
	nodes := []corev1.Node{gpuNode("gpu-000", "ubuntu", "22.04"), gpuNode("gpu-001", "ubuntu", "22.04")}
	dss, pods := stack(t, p, nodes, nil)
	oldDriver := "nvcr.io/nvidia/driver:550.127.08-ubuntu22.04"
	oldDSS, oldPods := stack(t, p, nodes, map[string]string{"driver": oldDriver})
	twoOS := []corev1.Node{nodes[0], gpuNode("gpu-002", "ubuntu", "24.04")}
	twoOSDSS, twoOSPods := stack(t, p, twoOS, nil)

	ownHere := deployment(stackNS, "gpufleet-operator", 2, nil)
	ownStopped := ownHere
	ownStopped.Spec.Replicas = ptr.To[int32](0)
	ownStopped.Annotations = map[string]string{AnnotationScaledDownFrom: "2"}
	gpuOp := deployment(stackNS, "gpu-operator", 1, gpuOperatorHelmLabels)
	gpuOpStopped := gpuOp
	gpuOpStopped.Spec.Replicas = ptr.To[int32](0)
	gpuOpLease := lease(stackNS, liveowner53822513, "gpu-operator-6c8649f9d9-x7k2p_0c1d2e3f")
	released := gpuOpLease
	released.Spec.HolderIdentity = ptr.To("")

	gpufleetCreated := dss[0]
	gpufleetCreated.Name = "gpufleet-driver-ubuntu24.04"
	gpufleetCreated.Labels = map[string]string{gpustack.LabelManagedBy: "gpufleet", gpustack.LabelComponent: "driver"}
	gpufleetCreated.Annotations = nil

	mo := deployment("maintenance-operator", "maintenance-operator", 1, map[string]string{
		"app.kubernetes.io/component": "maintenance-operator-controller-manager", "app.kubernetes.io/managed-by": "Helm",
		"app.kubernetes.io/instance": "maintenance-operator"})
	moStopped := mo
	moStopped.Spec.Replicas = ptr.To[int32](0)
	moLease := lease("maintenance-operator", "a9620a8f.nvidia.com", "maintenance-operator-5d9f7c-abcde_1234")
	netop := testobj.Requestor("nvidia.network-operator")
	nms := []maintenancev1.NodeMaintenance{
		*testobj.NodeMaintenance("ready", "gpu-005", netop, testobj.Phase(maintenancev1.PhaseReady), testobj.Finalizer()),
		*testobj.NodeMaintenance("pending", "gpu-000", netop),
		*testobj.NodeMaintenance("draining", "gpu-004", netop, testobj.Phase(maintenancev1.PhaseDraining), testobj.Finalizer()),
		*testobj.NodeMaintenance("scheduled", "gpu-001", netop, testobj.Phase(maintenancev1.PhaseScheduled)),
		*testobj.NodeMaintenance("cordon", "gpu-002", netop, testobj.Phase(maintenancev1.PhaseCordon), testobj.Finalizer()),
		*testobj.NodeMaintenance("waiting", "gpu-003", netop, testobj.Phase(maintenancev1.PhaseWaitForPodCompletion), testobj.Finalizer()),
		*testobj.NodeMaintenance("failed", "gpu-006", netop, testobj.Phase(maintenancev1.PhaseRequestorFailed), testobj.Finalizer()),
	}
	moOwn := deployment("gpufleet-system", "gpufleet-operator", 2, nil)

	gc := chartDefaultGPUCluster(t, p.CreationTimestamp.Add(-time.Hour))
	heldGC := chartDefaultGPUCluster(t, p.CreationTimestamp.Add(time.Hour))
	draDSS, draCtl, draPods := draStack(t, gc, nodes, nil)
	oldDRADSS, oldDRACtl, oldDRAPods := draStack(t, gc, nodes, map[string]string{gpucluster.DCGMExporter: "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.2-4.7.1-distroless"})
	noExporter := slices.DeleteFunc(slices.Clone(draDSS), func(d appsv1.DaemonSet) bool { return d.Name == gpucluster.DCGMExporter })
	adoptedDRA, adoptedCtl := adoptedWorkloads(draDSS, draCtl, gpucluster.DCGMExporter)

	tests := map[string]struct {
		snap Snapshot
		dir  Direction
		want summary
	}{
		"converged chart-default stack: all adopted, nothing restarts": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{gpuOp, ownHere}, Leases: []coordinationv1.Lease{gpuOpLease},
				Policies: []nvidiav1.ClusterPolicy{*p}, Nodes: nodes, DaemonSets: dss, Pods: pods},
			dir:  Direction{Operator: GPUOperator},
			want: summary{Stop: []string{"gpu-operator/gpu-operator"}, LeaseHeld: true, Adopted: allAdopted},
		},
		"another driver version: the driver is replaced through NodeMaintenance": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{gpuOp, ownHere}, Leases: []coordinationv1.Lease{gpuOpLease},
				Policies: []nvidiav1.ClusterPolicy{*p}, Nodes: nodes, DaemonSets: oldDSS, Pods: oldPods},
			dir: Direction{Operator: GPUOperator},
			want: summary{Stop: []string{"gpu-operator/gpu-operator"}, LeaseHeld: true, Adopted: allAdopted[1:],
				Restarts: []string{"nvidia-driver-daemonset"}},
		},
		"two OS flavours: the driver is blocked": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{gpuOp, ownHere}, Leases: []coordinationv1.Lease{gpuOpLease},
				Policies: []nvidiav1.ClusterPolicy{*p}, Nodes: twoOS, DaemonSets: twoOSDSS, Pods: twoOSPods},
			dir:  Direction{Operator: GPUOperator},
			want: summary{Stop: []string{"gpu-operator/gpu-operator"}, LeaseHeld: true, Adopted: allAdopted[1:], Blocked: 1, Problems: 1},
		},
		"gpufleet in another namespace than the stack": {
			snap: Snapshot{Namespace: "gpufleet-system", Deployments: []appsv1.Deployment{gpuOp, moOwn}, Leases: []coordinationv1.Lease{gpuOpLease},
				Policies: []nvidiav1.ClusterPolicy{*p}, Nodes: nodes, DaemonSets: dss, Pods: pods},
			dir:  Direction{Operator: GPUOperator},
			want: summary{Stop: []string{"gpu-operator/gpu-operator"}, LeaseHeld: true, Adopted: allAdopted, Problems: 1},
		},
		"already stopped, lease released, gpufleet scaled down by a hand-back: started again": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{gpuOpStopped, ownStopped}, Leases: []coordinationv1.Lease{released},
				Policies: []nvidiav1.ClusterPolicy{*p}, Nodes: nodes, DaemonSets: dss, Pods: pods},
			dir:  Direction{Operator: GPUOperator},
			want: summary{Start: []string{"gpu-operator/gpufleet-operator=2"}, Adopted: allAdopted},
		},
		"lease held, no Deployment found": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{ownHere}, Leases: []coordinationv1.Lease{gpuOpLease},
				Policies: []nvidiav1.ClusterPolicy{*p}, Nodes: nodes, DaemonSets: dss, Pods: pods},
			dir:  Direction{Operator: GPUOperator},
			want: summary{LeaseHeld: true, Adopted: allAdopted, Problems: 1},
		},
		"back to the GPU Operator: kept templates, one replaced, one created by gpufleet": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{gpuOpStopped, ownHere},
				Leases:   []coordinationv1.Lease{lease(stackNS, "gpufleet-operator", "gpufleet-operator-7d9c-xyz")},
				Policies: []nvidiav1.ClusterPolicy{*p}, Nodes: nodes, DaemonSets: append(adoptedBy(dss, "nvidia-dcgm-exporter"), gpufleetCreated), Pods: pods},
			dir: Direction{Operator: GPUOperator, Back: true},
			want: summary{Stop: []string{"gpu-operator/gpufleet-operator"}, Start: []string{"gpu-operator/gpu-operator=1"}, LeaseHeld: true,
				Adopted: []string{"nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset", "nvidia-operator-validator",
					"nvidia-device-plugin-daemonset", "gpu-feature-discovery", "nvidia-mig-manager"},
				Restarts: []string{"nvidia-dcgm-exporter"}, Problems: 1},
		},
		"maintenance objects in every phase": {
			snap: Snapshot{Namespace: "gpufleet-system", Deployments: []appsv1.Deployment{mo, moOwn}, Leases: []coordinationv1.Lease{moLease},
				NodeMaintenances: nms},
			dir: Direction{Operator: MaintenanceOperator},
			want: summary{Stop: []string{"maintenance-operator/maintenance-operator"}, LeaseHeld: true,
				InFlight: []string{"Pending pending", "Scheduled scheduled", "Cordon cordon", "WaitForPodCompletion waiting", "Draining draining",
					"Ready ready", "RequestorFailed failed"}},
		},
		"maintenance operator stopped, lease not held": {
			snap: Snapshot{Namespace: "gpufleet-system", Deployments: []appsv1.Deployment{moStopped, moOwn}, NodeMaintenances: nms[:1]},
			dir:  Direction{Operator: MaintenanceOperator},
			want: summary{InFlight: []string{"Ready ready"}},
		},
		"back to the maintenance operator": {
			snap: Snapshot{Namespace: "gpufleet-system", Deployments: []appsv1.Deployment{moStopped, moOwn}, NodeMaintenances: nms[2:3]},
			dir:  Direction{Operator: MaintenanceOperator, Back: true},
			want: summary{Stop: []string{"gpufleet-system/gpufleet-operator"}, Start: []string{"maintenance-operator/maintenance-operator=1"},
				InFlight: []string{"Draining draining"}},
		},
		"GPUCluster's DRA stack: every workload taken over, nothing restarts": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{gpuOp, ownHere, draCtl}, Leases: []coordinationv1.Lease{gpuOpLease},
				GPUClusters: []nvidiav1alpha1.GPUCluster{*gc}, Nodes: nodes, DaemonSets: draDSS, Pods: draPods},
			dir: Direction{Operator: GPUOperator},
			want: summary{Stop: []string{"gpu-operator/gpu-operator"}, LeaseHeld: true,
				Adopted: []string{gpucluster.KubeletPlugin, gpucluster.Controller, gpucluster.DCGMExporter}},
		},
		"GPUCluster's DRA stack: an older exporter rolls, a missing one is created": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{gpuOpStopped, ownHere, oldDRACtl}, Leases: []coordinationv1.Lease{released},
				GPUClusters: []nvidiav1alpha1.GPUCluster{*gc}, Nodes: nodes, DaemonSets: oldDRADSS, Pods: oldDRAPods},
			dir:  Direction{Operator: GPUOperator},
			want: summary{Adopted: []string{gpucluster.KubeletPlugin, gpucluster.Controller}, Restarts: []string{gpucluster.DCGMExporter}},
		},
		"GPUCluster's DRA stack without its exporter, in another namespace than gpufleet": {
			snap: Snapshot{Namespace: "gpufleet-system", Deployments: []appsv1.Deployment{gpuOp, moOwn, draCtl}, Leases: []coordinationv1.Lease{gpuOpLease},
				GPUClusters: []nvidiav1alpha1.GPUCluster{*gc}, Nodes: nodes, DaemonSets: noExporter, Pods: draPods},
			dir:  Direction{Operator: GPUOperator},
			want: summary{Stop: []string{"gpu-operator/gpu-operator"}, LeaseHeld: true, Adopted: []string{gpucluster.KubeletPlugin, gpucluster.Controller}, New: 1, Problems: 1},
		},
		"a ClusterPolicy and a newer GPUCluster: the ClusterPolicy's stack is taken over": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{gpuOp, ownHere}, Leases: []coordinationv1.Lease{gpuOpLease},
				Policies: []nvidiav1.ClusterPolicy{*p}, GPUClusters: []nvidiav1alpha1.GPUCluster{*heldGC}, Nodes: nodes, DaemonSets: dss, Pods: pods},
			dir:  Direction{Operator: GPUOperator},
			want: summary{Stop: []string{"gpu-operator/gpu-operator"}, LeaseHeld: true, Adopted: allAdopted},
		},
		"back to the GPU Operator with a GPUCluster: kept templates, the exporter replaced": {
			snap: Snapshot{Namespace: stackNS, Deployments: []appsv1.Deployment{gpuOpStopped, ownHere, adoptedCtl},
				Leases:      []coordinationv1.Lease{lease(stackNS, "gpufleet-operator", "gpufleet-operator-7d9c-xyz")},
				GPUClusters: []nvidiav1alpha1.GPUCluster{*gc}, Nodes: nodes, DaemonSets: adoptedDRA, Pods: draPods},
			dir: Direction{Operator: GPUOperator, Back: true},
			want: summary{Stop: []string{"gpu-operator/gpufleet-operator"}, Start: []string{"gpu-operator/gpu-operator=1"}, LeaseHeld: true,
				Adopted: []string{gpucluster.KubeletPlugin, gpucluster.Controller}, Restarts: []string{gpucluster.DCGMExporter}},
		},
		"no gpufleet Deployment": {
			snap: Snapshot{Namespace: "gpufleet-system", Deployments: []appsv1.Deployment{mo}},
			dir:  Direction{Operator: MaintenanceOperator},
			want: summary{Stop: []string{"maintenance-operator/maintenance-operator"}, Problems: 1},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.snap.Now, tc.snap.OwnDeployment = now, "gpufleet-operator"
			plan := MakePlan(tc.snap, tc.dir)
			if diff := cmp.Diff(tc.want, summarize(plan)); diff != "" {
				t.Errorf("plan (-want +got):\n%s\nproblems: %q", diff, plan.Problems)
			}
			var out bytes.Buffer
			if err := plan.Write(&out); err != nil {
				t.Fatal(err)
			}
			golden(t, out.Bytes())
		})
	}
}

const liveowner53822513 = "53822513.nvidia.com"

func golden(t *testing.T, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", sanitize(t.Name())+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/takeover -update to write it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("report differs from %s (-want +got; go test ./internal/takeover -update rewrites it):\n%s", path, diff)
	}
}

var unsafeInName = regexp.MustCompile(`[^A-Za-z0-9_-]`)

func sanitize(name string) string { return unsafeInName.ReplaceAllString(name, "_") }

func TestParseOperator(t *testing.T) {
	for _, s := range []string{"gpu-operator", "maintenance-operator"} {
		if o, err := ParseOperator(s); err != nil || string(o) != s {
			t.Errorf("ParseOperator(%q) = %q, %v", s, o, err)
		}
	}
	if _, err := ParseOperator("network-operator"); err == nil {
		t.Error("ParseOperator accepted network-operator")
	}
}

func TestIsDeployment(t *testing.T) {
	tests := map[string]struct {
		op   Operator
		d    appsv1.Deployment
		want bool
	}{
		"GPU Operator by name":                     {GPUOperator, deployment("x", "gpu-operator", 1, nil), true},
		"GPU Operator by label":                    {GPUOperator, deployment("x", "my-gpu-op", 1, map[string]string{"app": "gpu-operator"}), true},
		"NFD is not the GPU Operator":              {GPUOperator, deployment("x", "gpu-operator-node-feature-discovery-master", 1, map[string]string{"app.kubernetes.io/name": "node-feature-discovery"}), false},
		"Maintenance Operator, Helm":               {MaintenanceOperator, deployment("maintenance-operator", "maintenance-operator", 1, nil), true},
		"Maintenance Operator, kustomize":          {MaintenanceOperator, deployment("maintenance-operator-system", "maintenance-operator-controller-manager", 1, nil), true},
		"Maintenance Operator, another release":    {MaintenanceOperator, deployment("m", "x-maintenance-operator", 1, map[string]string{"app.kubernetes.io/component": "maintenance-operator-controller-manager"}), true},
		"gpufleet is not the Maintenance Operator": {MaintenanceOperator, deployment("gpufleet-system", "gpufleet-operator", 1, nil), false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.op.IsDeployment(&tc.d); got != tc.want {
				t.Errorf("IsDeployment = %t, want %t", got, tc.want)
			}
		})
	}
}

// TestPlanFindsGPUFleetUnderAnotherName: gpufleet's operator installed by
// a Helm release of another name, or in another namespace, than the
// takeover was told: the plan says where it runs (a problem: nothing is
// changed); and a second gpufleet operator beside the named one is a
// problem too (two would act at once).
func TestPlanFindsGPUFleetUnderAnotherName(t *testing.T) {
	fleet := func(ns, name string, replicas int32) appsv1.Deployment {
		d := deployment(ns, name, replicas, map[string]string{"app.kubernetes.io/name": "gpufleet"})
		d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "operator", Image: "registry.example/gpufleet:1", Command: []string{"/gpufleet", "operator"}}}
		return d
	}
	for name, tc := range map[string]struct {
		deps []appsv1.Deployment
		want string
	}{
		"another release name": {deps: []appsv1.Deployment{fleet("gpufleet-system", "prod-gpufleet-operator", 2)},
			want: "gpufleet's operator runs as Deployment gpufleet-system/prod-gpufleet-operator (2 replicas): name it with -n gpufleet-system --deployment prod-gpufleet-operator"},
		"a second gpufleet beside it": {deps: []appsv1.Deployment{fleet("gpufleet-system", "gpufleet-operator", 1), fleet("team-b", "gpufleet-operator", 1)},
			want: "another gpufleet operator runs as Deployment team-b/gpufleet-operator (1 replicas): two would act at once"},
	} {
		t.Run(name, func(t *testing.T) {
			s := Snapshot{Namespace: "gpufleet-system", OwnDeployment: "gpufleet-operator", Now: now, Deployments: tc.deps}
			p := MakePlan(s, Direction{Operator: MaintenanceOperator})
			if !slices.ContainsFunc(p.Problems, func(pr string) bool { return strings.HasPrefix(pr, tc.want) }) {
				t.Errorf("problems %q, want one saying %q", p.Problems, tc.want)
			}
		})
	}
}
