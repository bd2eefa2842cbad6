// Package gpucluster deploys the GPU software stack of a GPUCluster
// (nvidia.com/v1alpha1): NVIDIA's DRA driver for GPUs (its kubelet plugin
// on every GPU node, its compute-domain controller, its DeviceClasses),
// DCGM and dcgm-exporter, for clusters that allocate GPUs through Dynamic
// Resource Allocation. The objects are rendered by a pure function
// (render.go), the node labels (labels.go) and the status (status.go) are
// decided by pure functions, and a thin controller applies them
// (controller.go).
package gpucluster

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// Labels and names.
const (
	managedBy = "gpufleet"
	// partOf tells the GPUCluster's objects from the ClusterPolicy's
	// (gpufleet-gpu-stack), which that controller prunes.
	partOf = "gpufleet-gpu-cluster"
	// LabelApp is the selector label of every workload, as NVIDIA's GPU
	// Operator sets it: a DaemonSet it left is taken over with its
	// selector unchanged.
	LabelApp = "app"

	// Workloads, named as NVIDIA's GPU Operator names them.
	KubeletPlugin = "nvidia-dra-driver-kubelet-plugin"
	Controller    = "nvidia-dra-driver-controller"
	DCGMExporter  = "nvidia-dcgm-exporter-dra"
	DCGM          = "nvidia-dcgm-dra"

	kubeletPluginSA = "nvidia-dra-driver-kubeletplugin"
	controllerSA    = "nvidia-dra-driver-controller"

	// Node labels that let a workload run on a GPU node.
	DeployDRADriver    = "nvidia.com/gpu.deploy.dra-driver"
	DeployDCGMExporter = "nvidia.com/gpu.deploy.dcgm-exporter-dra"
	DeployDCGM         = "nvidia.com/gpu.deploy.dcgm-dra"

	// LabelAdminAccess on a namespace lets its ResourceClaims ask for
	// admin access to devices (the exporter and DCGM see every GPU of
	// their node that way, allocated to others or not).
	LabelAdminAccess = "resource.kubernetes.io/admin-access"

	gpuHealthPort = 51516
	cdHealthPort  = 51515
	exporterPort  = 9400
	dcgmPort      = 5555
)

// DeviceClasses the DRA driver's devices are requested by.
var (
	gpuClasses = map[string]string{
		"gpu.nvidia.com":      "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
		"mig.nvidia.com":      "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
		"vfio.gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'",
	}
	computeDomainClasses = map[string]string{
		"compute-domain-daemon.nvidia.com":          "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'daemon'",
		"compute-domain-default-channel.nvidia.com": "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel' && device.attributes['compute-domain.nvidia.com'].id == 0",
	}
)

// Default images (NVIDIA's chart defaults of the GPU Operator v26.7).
var (
	defaultDRADriver    = [3]string{"nvcr.io/nvidia", "dra-driver-nvidia-gpu", "v0.5.0"}
	defaultDCGM         = [3]string{"nvcr.io/nvidia/cloud-native", "dcgm", "4.6.0-1-ubuntu24.04"}
	defaultDCGMExporter = [3]string{"nvcr.io/nvidia/k8s", "dcgm-exporter", "4.6.0-4.8.3-distroless"}
	// The validation that waits for the host's driver runs the GPU
	// Operator's validator.
	defaultValidator = [3]string{"nvcr.io/nvidia", "gpu-operator", "v26.7.0"}
)

// DeviceClassNames are the DeviceClasses of a GPUCluster, sorted.
func DeviceClassNames(gc *nvidiav1alpha1.GPUCluster) []string {
	names := slices.Collect(maps.Keys(gpuClasses))
	if gc.Spec.DRADriver.ComputeDomainsEnabled() {
		names = slices.AppendSeq(names, maps.Keys(computeDomainClasses))
	}
	slices.Sort(names)
	return names
}

// DCGMEnabled: the standalone host engine runs only when enabled.
func DCGMEnabled(gc *nvidiav1alpha1.GPUCluster) bool {
	d := gc.Spec.DCGM
	return d != nil && d.Enabled != nil && *d.Enabled
}

// ExporterEnabled: dcgm-exporter runs unless disabled.
func ExporterEnabled(gc *nvidiav1alpha1.GPUCluster) bool {
	e := gc.Spec.DCGMExporter
	return e == nil || e.Enabled == nil || *e.Enabled
}

// Render returns every object of the GPUCluster's stack in namespace ns, in
// the order they are applied. The objects that run on nodes carry gpufleet's
// labels and the GPUCluster as controller (deleted with it), except the
// DeviceClasses: claims in use refer to them, so they outlive it.
func Render(gc *nvidiav1alpha1.GPUCluster, ns string) ([]client.Object, error) {
	spec := &gc.Spec
	draImage, err := image(spec.DRADriver.Repository, spec.DRADriver.Image, spec.DRADriver.Version, defaultDRADriver)
	if err != nil {
		return nil, fmt.Errorf("draDriver: %w", err)
	}
	r := renderer{gc: gc, ns: ns}
	var out []client.Object
	out = append(out, r.own(&corev1.ServiceAccount{ObjectMeta: r.meta(kubeletPluginSA, KubeletPlugin)}))
	out = append(out, r.own(&rbacv1.ClusterRole{ObjectMeta: r.clusterMeta(kubeletPluginSA, KubeletPlugin), Rules: kubeletPluginRules}))
	out = append(out, r.own(&rbacv1.ClusterRoleBinding{ObjectMeta: r.clusterMeta(kubeletPluginSA, KubeletPlugin),
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: kubeletPluginSA},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: kubeletPluginSA, Namespace: ns}}}))
	for _, name := range DeviceClassNames(gc) {
		expr := gpuClasses[name]
		if expr == "" {
			expr = computeDomainClasses[name]
		}
		dc := &resourcev1.DeviceClass{ObjectMeta: r.clusterMeta(name, KubeletPlugin),
			Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: expr}}}}}
		out = append(out, dc) // no owner: claims in use refer to it
	}
	out = append(out, r.own(r.kubeletPlugin(draImage)))
	if spec.DRADriver.ComputeDomainsEnabled() {
		out = append(out, r.own(&corev1.ServiceAccount{ObjectMeta: r.meta(controllerSA, Controller)}))
		out = append(out, r.own(&rbacv1.ClusterRole{ObjectMeta: r.clusterMeta(controllerSA, Controller), Rules: controllerRules}))
		out = append(out, r.own(&rbacv1.ClusterRoleBinding{ObjectMeta: r.clusterMeta(controllerSA, Controller),
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: controllerSA},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: controllerSA, Namespace: ns}}}))
		out = append(out, r.own(&rbacv1.Role{ObjectMeta: r.meta(controllerSA, Controller), Rules: controllerNamespacedRules}))
		out = append(out, r.own(&rbacv1.RoleBinding{ObjectMeta: r.meta(controllerSA, Controller),
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: controllerSA},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: controllerSA, Namespace: ns}}}))
		out = append(out, r.own(r.controller(draImage)))
	}
	if DCGMEnabled(gc) {
		img, err := image(spec.DCGM.Repository, spec.DCGM.Image, spec.DCGM.Version, defaultDCGM)
		if err != nil {
			return nil, fmt.Errorf("dcgm: %w", err)
		}
		out = append(out, r.monitoring(DCGM, DeployDCGM, "nvidia-dcgm-admin", &spec.DCGM.ComponentSpec, img, dcgmPort)...)
	}
	if ExporterEnabled(gc) {
		e := spec.DCGMExporter
		if e == nil {
			e = &nvidiav1.DCGMExporterSpec{}
		}
		img, err := image(e.Repository, e.Image, e.Version, defaultDCGMExporter)
		if err != nil {
			return nil, fmt.Errorf("dcgmExporter: %w", err)
		}
		objs := r.monitoring(DCGMExporter, DeployDCGMExporter, "nvidia-dcgm-exporter-admin", &e.ComponentSpec, img, exporterPort)
		for _, o := range objs {
			if ds, ok := o.(*appsv1.DaemonSet); ok {
				r.exporter(ds, e)
			}
		}
		out = append(out, objs...)
	}
	return out, nil
}

type renderer struct {
	gc *nvidiav1alpha1.GPUCluster
	ns string
}

func (r renderer) labels(component string) map[string]string {
	l := map[string]string{}
	maps.Copy(l, r.gc.Spec.Daemonsets.Labels)
	maps.Copy(l, map[string]string{
		gpustack.LabelManagedBy: managedBy, gpustack.LabelPartOf: partOf, gpustack.LabelComponent: component,
		"app.kubernetes.io/name": "nvidia-dra-driver",
	})
	return l
}

func (r renderer) meta(name, component string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: r.ns, Labels: r.labels(component)}
}

func (r renderer) clusterMeta(name, component string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: r.labels(component)}
}

// own makes the GPUCluster the object's controller.
func (r renderer) own(o client.Object) client.Object {
	o.SetOwnerReferences([]metav1.OwnerReference{*metav1.NewControllerRef(r.gc, nvidiav1alpha1.GroupVersion.WithKind("GPUCluster"))})
	return o
}

// podMeta is a workload's pod template metadata: its selector label, the
// common labels less the ones a selector must not carry, the common
// annotations.
func (r renderer) podMeta(app string) metav1.ObjectMeta {
	l := r.labels(app)
	delete(l, gpustack.LabelPartOf)
	l[LabelApp] = app
	var a map[string]string
	if len(r.gc.Spec.Daemonsets.Annotations) > 0 {
		a = maps.Clone(r.gc.Spec.Daemonsets.Annotations)
	}
	return metav1.ObjectMeta{Labels: l, Annotations: a}
}

func (r renderer) daemonSet(app, deployLabel string, ps corev1.PodSpec) *appsv1.DaemonSet {
	d := &r.gc.Spec.Daemonsets
	ps.NodeSelector = map[string]string{deployLabel: "true"}
	ps.PriorityClassName = d.PriorityClassName
	if ps.PriorityClassName == "" {
		ps.PriorityClassName = "system-node-critical"
	}
	ps.Tolerations = append(ps.Tolerations, d.Tolerations...)
	if d.PodSecurityContext != nil {
		ps.SecurityContext = d.PodSecurityContext.DeepCopy()
	}
	meta := r.meta(app, app)
	meta.Labels[LabelApp] = app
	if len(d.Annotations) > 0 {
		meta.Annotations = maps.Clone(d.Annotations)
	}
	ds := &appsv1.DaemonSet{ObjectMeta: meta, Spec: appsv1.DaemonSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelApp: app}},
		Template: corev1.PodTemplateSpec{ObjectMeta: r.podMeta(app), Spec: ps},
	}}
	if d.UpdateStrategy == string(appsv1.OnDeleteDaemonSetStrategyType) {
		ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
	} else {
		maxUnavailable := intstr.FromString("1")
		if d.RollingUpdate != nil && d.RollingUpdate.MaxUnavailable != "" {
			maxUnavailable = intstr.Parse(d.RollingUpdate.MaxUnavailable)
		}
		ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &maxUnavailable}}
	}
	return ds
}

func hostPath(name, path string, t corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: ptr.To(t)}}}
}

func (r renderer) driverRoot() string {
	if p := r.gc.Spec.HostPaths.DriverInstallDir; p != "" {
		return p
	}
	return "/run/nvidia/driver"
}

func (r renderer) kubeletRoot() string {
	if p := r.gc.Spec.HostPaths.KubeletRootDir; p != "" {
		return strings.TrimSuffix(p, "/")
	}
	return "/var/lib/kubelet"
}

// driverValidation waits on the node until the host's driver works (the
// DRA driver needs it; the GPUCluster does not install it).
func (r renderer) driverValidation() (corev1.Container, error) {
	img, err := image("", "", "", defaultValidator)
	return corev1.Container{
		Name: "driver-validation", Image: img, Command: []string{"nvidia-validator"},
		Env: []corev1.EnvVar{
			{Name: "COMPONENT", Value: "driver"}, {Name: "WITH_WAIT", Value: "true"},
			{Name: "DRIVER_VALIDATION_SKIP_GPU_INIT", Value: "true"}, {Name: "HOST_ROOT", Value: "/"},
			{Name: "DRIVER_INSTALL_DIR", Value: r.driverRoot()}, {Name: "DRIVER_INSTALL_DIR_CTR_PATH", Value: "/driver-root"},
		},
		SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)},
		VolumeMounts: []corev1.VolumeMount{{Name: "host-root", MountPath: "/host", ReadOnly: true, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
			{Name: "driver-root", MountPath: "/driver-root", ReadOnly: true, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)}},
	}, err
}

func (r renderer) kubeletPlugin(img string) *appsv1.DaemonSet {
	dra := &r.gc.Spec.DRADriver
	kubelet := r.kubeletRoot()
	validation, _ := r.driverValidation() // the default image is a constant
	containers := []corev1.Container{r.pluginContainer("gpus", "gpu-kubelet-plugin", img, &dra.GPUs.KubeletPlugin, gpuHealthPort)}
	if dra.ComputeDomainsEnabled() {
		containers = append(containers, r.pluginContainer("compute-domains", "compute-domain-kubelet-plugin", img, &dra.ComputeDomains.KubeletPlugin, cdHealthPort))
	}
	ps := corev1.PodSpec{
		ServiceAccountName: kubeletPluginSA,
		InitContainers:     []corev1.Container{validation},
		Containers:         containers,
		Volumes: []corev1.Volume{
			hostPath("plugins-registry", kubelet+"/plugins_registry", corev1.HostPathDirectory),
			hostPath("plugins", kubelet+"/plugins", corev1.HostPathDirectoryOrCreate),
			hostPath("cdi", "/var/run/cdi", corev1.HostPathDirectoryOrCreate),
			hostPath("driver-root", r.driverRoot(), corev1.HostPathDirectoryOrCreate),
			hostPath("host-root", "/", corev1.HostPathDirectory),
			hostPath("host-dev", "/dev", corev1.HostPathDirectory),
		},
		ImagePullSecrets: pullSecrets(dra.ImagePullSecrets),
	}
	return r.daemonSet(KubeletPlugin, DeployDRADriver, ps)
}

func (r renderer) pluginContainer(name, command, img string, spec *nvidiav1alpha1.DRADriverKubeletPluginSpec, port int32) corev1.Container {
	dra := &r.gc.Spec.DRADriver
	c := corev1.Container{
		Name: name, Image: img, ImagePullPolicy: corev1.PullPolicy(dra.ImagePullPolicy), Command: []string{command},
		Env: []corev1.EnvVar{
			{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "CDI_ROOT", Value: "/var/run/cdi"},
			{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"},
			{Name: "NVIDIA_DRIVER_ROOT", Value: r.driverRoot()},
			{Name: "KUBELET_REGISTRAR_DIRECTORY_PATH", Value: r.kubeletRoot() + "/plugins_registry"},
			{Name: "KUBELET_PLUGINS_DIRECTORY_PATH", Value: r.kubeletRoot() + "/plugins"},
		},
		SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "plugins-registry", MountPath: r.kubeletRoot() + "/plugins_registry"},
			{Name: "plugins", MountPath: r.kubeletRoot() + "/plugins", MountPropagation: ptr.To(corev1.MountPropagationBidirectional)},
			{Name: "cdi", MountPath: "/var/run/cdi"},
			{Name: "driver-root", MountPath: "/driver-root", ReadOnly: true, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
			{Name: "host-dev", MountPath: "/dev"},
		},
	}
	if gates := featureGates(dra.FeatureGates); gates != "" {
		c.Env = append(c.Env, corev1.EnvVar{Name: "FEATURE_GATES", Value: gates})
	}
	if h := spec.Healthcheck; h == nil || h.Enabled == nil || *h.Enabled {
		if h != nil && h.Port != nil {
			port = *h.Port
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: "HEALTHCHECK_PORT", Value: strconv.Itoa(int(port))})
		probe := corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: port, Service: ptr.To("liveness")}}
		// Every field the API server defaults is set, so that the stored
		// DaemonSet reads as up to date (UpToDate compares ints exactly).
		c.StartupProbe = &corev1.Probe{ProbeHandler: probe, PeriodSeconds: 5, FailureThreshold: 60, TimeoutSeconds: 1, SuccessThreshold: 1}
		c.LivenessProbe = &corev1.Probe{ProbeHandler: probe, PeriodSeconds: 10, FailureThreshold: 3, TimeoutSeconds: 1, SuccessThreshold: 1}
	}
	c.Env = mergeEnv(c.Env, spec.Env)
	if spec.Resources != nil {
		c.Resources = corev1.ResourceRequirements{Limits: spec.Resources.Limits, Requests: spec.Resources.Requests}
	}
	return c
}

func (r renderer) controller(img string) *appsv1.Deployment {
	dra := &r.gc.Spec.DRADriver
	ctl := &dra.ComputeDomains.Controller
	c := corev1.Container{
		Name: "compute-domain", Image: img, ImagePullPolicy: corev1.PullPolicy(dra.ImagePullPolicy), Command: []string{"compute-domain-controller", "-v", "1"},
		Env: mergeEnv([]corev1.EnvVar{
			{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "IMAGE_NAME", Value: img},
		}, ctl.Env),
	}
	if gates := featureGates(dra.FeatureGates); gates != "" {
		c.Env = append(c.Env, corev1.EnvVar{Name: "FEATURE_GATES", Value: gates})
	}
	if ctl.Resources != nil {
		c.Resources = corev1.ResourceRequirements{Limits: ctl.Resources.Limits, Requests: ctl.Resources.Requests}
	}
	meta := r.meta(Controller, Controller)
	meta.Labels[LabelApp] = Controller
	return &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](1),
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelApp: Controller}},
		Template: corev1.PodTemplateSpec{ObjectMeta: r.podMeta(Controller), Spec: corev1.PodSpec{
			ServiceAccountName: controllerSA,
			PriorityClassName:  "system-node-critical",
			Containers:         []corev1.Container{c},
			ImagePullSecrets:   pullSecrets(dra.ImagePullSecrets),
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
				Weight: 1, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.NodeSelectorOpExists}}}}}}},
			Tolerations: []corev1.Toleration{
				{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
				{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
			},
		}},
	}}
}

// monitoring renders DCGM or dcgm-exporter: a ServiceAccount, a claim
// template for admin access to every GPU of the node (their view of GPUs
// allocated to others), the DaemonSet and its Service.
func (r renderer) monitoring(app, deployLabel, claimTemplate string, spec *nvidiav1.ComponentSpec, img string, port int32) []client.Object {
	sa := &corev1.ServiceAccount{ObjectMeta: r.meta(app, app)}
	rct := &resourcev1.ResourceClaimTemplate{ObjectMeta: r.meta(claimTemplate, app), Spec: resourcev1.ResourceClaimTemplateSpec{
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com", AllocationMode: resourcev1.DeviceAllocationModeAll, AdminAccess: ptr.To(true)},
		}}}}}}
	c := corev1.Container{
		Name: strings.TrimSuffix(strings.TrimPrefix(app, "nvidia-"), "-dra"), Image: img, ImagePullPolicy: spec.ImagePullPolicy,
		Args: spec.Args, Env: spec.Env,
		Ports:     []corev1.ContainerPort{{Name: "metrics", ContainerPort: port}},
		Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
	}
	if app == DCGM {
		c.Ports[0].Name = "dcgm"
	}
	if spec.Resources != nil {
		c.Resources.Limits, c.Resources.Requests = spec.Resources.Limits, spec.Resources.Requests
	}
	if spec.SecurityContext != nil {
		c.SecurityContext = spec.SecurityContext.DeepCopy()
	}
	ps := corev1.PodSpec{
		ServiceAccountName: app,
		Containers:         []corev1.Container{c},
		ResourceClaims:     []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(claimTemplate)}},
		ImagePullSecrets:   pullSecrets(spec.ImagePullSecrets),
		Tolerations:        spec.Tolerations,
	}
	if spec.HostNetwork != nil && *spec.HostNetwork {
		ps.HostNetwork, ps.DNSPolicy = true, corev1.DNSClusterFirstWithHostNet
	}
	ds := r.daemonSet(app, deployLabel, ps)
	maps.Copy(ds.Spec.Template.Spec.NodeSelector, spec.NodeSelector)
	svc := &corev1.Service{ObjectMeta: r.meta(app, app), Spec: corev1.ServiceSpec{
		Selector: map[string]string{LabelApp: app},
		Ports:    []corev1.ServicePort{{Name: c.Ports[0].Name, Port: port, TargetPort: intstr.FromInt32(port)}},
	}}
	svc.Labels[LabelApp] = app
	return []client.Object{r.own(sa), r.own(rct), r.own(ds), r.own(svc)}
}

// exporter applies the exporter's own settings to its DaemonSet.
func (r renderer) exporter(ds *appsv1.DaemonSet, e *nvidiav1.DCGMExporterSpec) {
	ps := &ds.Spec.Template.Spec
	c := &ps.Containers[0]
	if DCGMEnabled(r.gc) {
		c.Env = mergeEnv(c.Env, []nvidiav1.EnvVar{{Name: "DCGM_REMOTE_HOSTENGINE_INFO", Value: fmt.Sprintf("%s:%d", DCGM, dcgmPort)}})
	}
	if e.HostPID != nil && *e.HostPID {
		ps.HostPID = true
	}
	if e.Config != nil && e.Config.Name != "" {
		c.Env = mergeEnv(c.Env, []nvidiav1.EnvVar{{Name: "DCGM_EXPORTER_COLLECTORS", Value: "/etc/dcgm-exporter/dcgm-metrics.csv"}})
		ps.Volumes = append(ps.Volumes, corev1.Volume{Name: "metrics-config", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: e.Config.Name}}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "metrics-config", MountPath: "/etc/dcgm-exporter/dcgm-metrics.csv", SubPath: "dcgm-metrics.csv"})
	}
	if len(e.Annotations) > 0 {
		if ds.Spec.Template.Annotations == nil {
			ds.Spec.Template.Annotations = map[string]string{}
		}
		maps.Copy(ds.Spec.Template.Annotations, e.Annotations)
	}
}

// image builds repository/image:version (or @digest) with the defaults
// for what is empty.
func image(repo, name, version string, def [3]string) (string, error) {
	if name == "" {
		name = def[1]
		if repo == "" {
			repo = def[0]
		}
	}
	if version == "" {
		version = def[2]
	}
	if strings.ContainsAny(name, " \t:@") || strings.ContainsAny(version, " \t/@") {
		return "", fmt.Errorf("invalid image %q version %q", name, version)
	}
	ref := name
	if repo != "" {
		ref = strings.TrimSuffix(repo, "/") + "/" + name
	}
	if strings.HasPrefix(version, "sha256:") {
		return ref + "@" + version, nil
	}
	return ref + ":" + version, nil
}

// featureGates renders the FEATURE_GATES value: "A=true,B=false", sorted.
func featureGates(g map[string]bool) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(g)) {
		parts = append(parts, k+"="+strconv.FormatBool(g[k]))
	}
	return strings.Join(parts, ",")
}

// mergeEnv is base with the user's variables: same name replaces, others
// appended in order.
func mergeEnv[E interface {
	~[]nvidiav1.EnvVar | ~[]corev1.EnvVar
}](base []corev1.EnvVar, extra E) []corev1.EnvVar {
	out := slices.Clone(base)
	add := func(e corev1.EnvVar) {
		if i := slices.IndexFunc(out, func(o corev1.EnvVar) bool { return o.Name == e.Name }); i >= 0 {
			out[i] = e
			return
		}
		out = append(out, e)
	}
	switch x := any(extra).(type) {
	case []nvidiav1.EnvVar:
		for _, e := range x {
			add(corev1.EnvVar{Name: e.Name, Value: e.Value})
		}
	case []corev1.EnvVar:
		for _, e := range x {
			add(e)
		}
	}
	return out
}

func pullSecrets(names []string) []corev1.LocalObjectReference {
	var out []corev1.LocalObjectReference
	for _, n := range names {
		out = append(out, corev1.LocalObjectReference{Name: n})
	}
	return out
}

// TemplateHash identifies a rendered pod template (JSON: maps in key order).
func TemplateHash(t *corev1.PodTemplateSpec) string {
	data, _ := json.Marshal(t) // a PodTemplateSpec always marshals
	h := fnv.New64a()
	h.Write(data)
	return fmt.Sprintf("%016x", h.Sum64())
}

var kubeletPluginRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"update"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	{APIGroups: []string{"resource.nvidia.com"}, Resources: []string{"computedomains"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"resource.nvidia.com"}, Resources: []string{"computedomaincliques"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
}

// controllerRules are the compute-domain controller's cluster-wide rules;
// the DaemonSets it runs for compute domains it writes through a Role of
// the stack's namespace (controllerNamespacedRules).
var controllerRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"resource.nvidia.com"}, Resources: []string{"computedomains"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
	{APIGroups: []string{"resource.nvidia.com"}, Resources: []string{"computedomains/status"}, Verbs: []string{"update", "patch"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaimtemplates"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"deviceclasses"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
}

var controllerNamespacedRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
}
