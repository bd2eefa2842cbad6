package devcluster

import (
	"maps"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// A GPU stack as NVIDIA's GPU Operator (v26.7, installed by its Helm chart,
// ClusterPolicy mode) leaves it once converged: its operand DaemonSets with
// their names, selectors, labels, annotations and update strategies, their
// ServiceAccounts and Services, the RuntimeClass, and the node labels it
// writes. Written from what the GPU Operator's manifests and controllers
// do; used to try and test a switch to gpufleet (gpufleet dev, tests). The
// pods are made by the cluster's DaemonSet controller, as they were.

// GPUOperatorStack is the GPU Operator's operands for one ClusterPolicy.
type GPUOperatorStack struct {
	// Namespace is the GPU Operator's (its Helm release's) namespace.
	Namespace string
	// Owner is the ClusterPolicy (controller reference).
	Owner metav1.OwnerReference
	// Images are the operands' images by component key (driver with its
	// OS suffix: what the policy names); the validation init containers
	// run the validator's ("operator-validator").
	Images map[string]string
	// ChartVersion is the Helm chart's version (its labels name it).
	ChartVersion string
}

// gpuOperatorOperand is one operand DaemonSet of the GPU Operator.
type gpuOperatorOperand struct {
	component, name, container string
	// partOf: the selector also has app.kubernetes.io/part-of.
	partOf      string
	validations []string
	sidecar     string // config-manager
	hostPID     bool
}

// The operands the chart-default ClusterPolicy enables (dcgm and the node
// status exporter are off by default; mig-manager's DaemonSet exists and
// runs on MIG-capable nodes only).
var gpuOperatorOperands = []gpuOperatorOperand{
	{component: "driver", name: "nvidia-driver-daemonset", container: "nvidia-driver-ctr", hostPID: true},
	{component: "container-toolkit", name: "nvidia-container-toolkit-daemonset", container: "nvidia-container-toolkit-ctr",
		validations: []string{"driver-validation"}, hostPID: true},
	{component: "operator-validator", name: "nvidia-operator-validator", container: "nvidia-operator-validator", partOf: "gpu-operator",
		validations: []string{"driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation"}},
	{component: "device-plugin", name: "nvidia-device-plugin-daemonset", container: "nvidia-device-plugin",
		validations: []string{"toolkit-validation"}, sidecar: "config-manager"},
	{component: "dcgm-exporter", name: "nvidia-dcgm-exporter", container: "nvidia-dcgm-exporter", validations: []string{"toolkit-validation"}},
	{component: "gpu-feature-discovery", name: "gpu-feature-discovery", container: "gpu-feature-discovery", partOf: "nvidia-gpu",
		validations: []string{"toolkit-validation"}, sidecar: "config-manager"},
	{component: "mig-manager", name: "nvidia-mig-manager", container: "nvidia-mig-manager", validations: []string{"toolkit-validation"}, hostPID: true},
}

// GPUOperatorDaemonSetNames are the operand DaemonSets' names by component.
func GPUOperatorDaemonSetNames() map[string]string {
	out := map[string]string{}
	for _, o := range gpuOperatorOperands {
		out[o.component] = o.name
	}
	return out
}

// Objects are the stack's objects, to create in this order.
func (s GPUOperatorStack) Objects() []client.Object {
	var out []client.Object
	chart := map[string]string{"helm.sh/chart": "gpu-operator-" + s.ChartVersion, "app.kubernetes.io/managed-by": "gpu-operator"}
	out = append(out, &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia", Labels: map[string]string{"app.kubernetes.io/component": "gpu-operator"},
			OwnerReferences: []metav1.OwnerReference{s.Owner}},
		Handler: "nvidia",
	})
	for _, o := range gpuOperatorOperands {
		sa := "nvidia-" + o.component
		switch o.component {
		case "gpu-feature-discovery":
			sa = "nvidia-gpu-feature-discovery"
		case "driver":
			sa = "nvidia-driver"
		}
		out = append(out, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: sa,
			OwnerReferences: []metav1.OwnerReference{s.Owner}}})
		out = append(out, s.daemonSet(o, sa, chart))
	}
	out = append(out, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: "nvidia-dcgm-exporter", Labels: map[string]string{"app": "nvidia-dcgm-exporter"},
			Annotations: map[string]string{"prometheus.io/scrape": "true"}, OwnerReferences: []metav1.OwnerReference{s.Owner}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "nvidia-dcgm-exporter"},
			Ports: []corev1.ServicePort{{Name: "gpu-metrics", Port: 9400, TargetPort: intstr.FromInt32(9400), Protocol: corev1.ProtocolTCP}}},
	})
	return out
}

func (s GPUOperatorStack) daemonSet(o gpuOperatorOperand, sa string, chart map[string]string) *appsv1.DaemonSet {
	selector := map[string]string{"app": o.name}
	if o.partOf != "" {
		selector["app.kubernetes.io/part-of"] = o.partOf
	}
	dsLabels := maps.Clone(selector)
	maps.Copy(dsLabels, chart)
	podLabels := maps.Clone(dsLabels)
	annotations := map[string]string{"nvidia.com/last-applied-hash": "2749238141"}
	podAnnotations := map[string]string{}
	if len(o.validations) > 0 {
		// The kubelet ran them when the stack converged.
		podAnnotations[AnnotationInitialized] = "true"
	}
	strategy := appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptr.To(intstr.FromInt32(1))}}
	if o.component == "driver" {
		for _, l := range []map[string]string{dsLabels, podLabels} {
			l["nvidia.com/precompiled"] = "false"
			l["app.kubernetes.io/component"] = "nvidia-driver"
		}
		annotations["openshift.io/scc"] = "nvidia-driver"
		podAnnotations["kubectl.kubernetes.io/default-container"] = o.container
		strategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
	}
	image := s.Images[o.component]
	containers := []corev1.Container{{Name: o.container, Image: image, ImagePullPolicy: corev1.PullIfNotPresent}}
	if o.sidecar != "" {
		containers = append(containers, corev1.Container{Name: o.sidecar, Image: image, ImagePullPolicy: corev1.PullIfNotPresent})
	}
	var inits []corev1.Container
	for _, v := range o.validations {
		inits = append(inits, corev1.Container{Name: v, Image: s.Images["operator-validator"], ImagePullPolicy: corev1.PullIfNotPresent})
	}
	if o.component == "driver" {
		inits = append(inits, corev1.Container{Name: "k8s-driver-manager", Image: "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.9.0"})
	}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: o.name, Labels: dsLabels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{s.Owner}},
		Spec: appsv1.DaemonSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: selector},
			UpdateStrategy: strategy,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: podAnnotations},
				Spec: corev1.PodSpec{
					ServiceAccountName: sa,
					PriorityClassName:  "system-node-critical",
					NodeSelector:       map[string]string{"nvidia.com/gpu.deploy." + o.component: "true"},
					Tolerations:        []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					HostPID:            o.hostPID,
					InitContainers:     inits,
					Containers:         containers,
				},
			},
		},
	}
}

// GPUOperatorNodeLabels are the labels the GPU Operator writes on a GPU
// node (container workloads, chart defaults; mig-manager's only on
// MIG-capable nodes), and the upgrade state it leaves after an upgrade.
func GPUOperatorNodeLabels(migCapable bool) map[string]string {
	out := map[string]string{"nvidia.com/gpu.present": "true", "nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}
	for _, c := range []string{"driver", "gpu-feature-discovery", "container-toolkit", "device-plugin", "dcgm", "dcgm-exporter",
		"node-status-exporter", "operator-validator"} {
		out["nvidia.com/gpu.deploy."+c] = "true"
	}
	if migCapable {
		out["nvidia.com/gpu.deploy.mig-manager"] = "true"
	}
	return out
}

// GPUOperatorNodeAnnotations are the annotations it writes on a GPU node
// (automatic driver upgrades on, the chart's default).
func GPUOperatorNodeAnnotations() map[string]string {
	return map[string]string{"nvidia.com/gpu-driver-upgrade-enabled": "true"}
}

// GPUOperatorLease is the GPU Operator's leader lease in namespace, held by
// holder and renewed at renewed (controller-runtime's 15 s duration).
func GPUOperatorLease(namespace, holder string, renewed time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: liveowner.GPUOperator.Lease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](15),
			AcquireTime: &metav1.MicroTime{Time: renewed}, RenewTime: &metav1.MicroTime{Time: renewed}},
	}
}
