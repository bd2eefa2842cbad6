package gpustack

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// The settings of dcgm-exporter and of the standalone DCGM host engine
// (spec.dcgmExporter, spec.dcgm), as NVIDIA's GPU Operator applies them in
// TransformDCGMExporter, TransformDCGMExporterService and TransformDCGM
// (pure).

// dcgm-exporter's env for attributing GPU metrics to pods beyond the
// pod-resources mount (namespace, pod, container): the pods' labels and
// UIDs, which it reads from the API server.
const (
	EnvDCGMExporterPodLabels         = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"
	EnvDCGMExporterPodUID            = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"
	EnvDCGMExporterPodLabelAllowlist = "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"
	// EnvDCGMRemoteHostEngine points dcgm-exporter at the standalone host
	// engine (host:port) instead of the one it embeds.
	EnvDCGMRemoteHostEngine = "DCGM_REMOTE_HOSTENGINE_INFO"

	// dcgmPort is the standalone host engine's port (its Service's too).
	dcgmPort = 5555
	// dcgmService is the standalone host engine's Service (asset dcgm.yaml).
	dcgmService = "nvidia-dcgm"
	// dcgmExporterPodReader is the ClusterRole (and binding) that lets
	// dcgm-exporter read pods, rendered only when it reads them.
	dcgmExporterPodReader = "nvidia-dcgm-exporter-read-pods"
)

// dcgmExporterEnv is dcgm-exporter's env from the policy, under the
// component's own env (which comes after and wins, as in gpu-operator):
//   - enablePodLabels / enablePodUID: the pods' labels / UID as labels of
//     their GPUs' metrics; podLabelAllowlistRegex: which pod labels (the
//     regexes joined with commas);
//   - with the standalone host engine (dcgm.enabled), the engine to use:
//     its Service, which sends each exporter to the engine of its own node
//     (internalTrafficPolicy Local).
func dcgmExporterEnv(spec *nvidiav1.ClusterPolicySpec) []corev1.EnvVar {
	e := &spec.DCGMExporter
	var env []corev1.EnvVar
	if isTrue(e.EnablePodLabels) {
		env = append(env, corev1.EnvVar{Name: EnvDCGMExporterPodLabels, Value: valueTrue})
	}
	if isTrue(e.EnablePodUID) {
		env = append(env, corev1.EnvVar{Name: EnvDCGMExporterPodUID, Value: valueTrue})
	}
	if len(e.PodLabelAllowlistRegex) > 0 {
		env = append(env, corev1.EnvVar{Name: EnvDCGMExporterPodLabelAllowlist, Value: strings.Join(e.PodLabelAllowlistRegex, ",")})
	}
	if dcgm, _ := componentByKey(DCGM); dcgm.Enabled(spec) {
		env = append(env, corev1.EnvVar{Name: EnvDCGMRemoteHostEngine, Value: fmt.Sprintf("%s:%d", dcgmService, dcgmPort)})
	}
	return env
}

// dcgmExporterReadsPods reports whether dcgm-exporter reads pods from the
// API server: pod labels or UIDs on, by the policy's fields or by its env
// (as gpu-operator decides when to give it API access). Only then is its
// pod-reader ClusterRole rendered.
func dcgmExporterReadsPods(spec *nvidiav1.ClusterPolicySpec) bool {
	e := &spec.DCGMExporter
	if isTrue(e.EnablePodLabels) || isTrue(e.EnablePodUID) {
		return true
	}
	return slices.ContainsFunc(e.Env, func(v corev1.EnvVar) bool {
		return (v.Name == EnvDCGMExporterPodLabels || v.Name == EnvDCGMExporterPodUID) && strings.EqualFold(v.Value, valueTrue)
	})
}

// dcgmExporterPod applies the pod-level settings of dcgmExporter: hostPID
// (the host's PID namespace, so per-process metrics see the workloads'
// processes) and annotations (the pods', over daemonsets.annotations).
func dcgmExporterPod(ds *appsv1.DaemonSet, spec *nvidiav1.ClusterPolicySpec) {
	e := &spec.DCGMExporter
	tpl := &ds.Spec.Template
	if isTrue(e.HostPID) {
		tpl.Spec.HostPID = true
	}
	if len(e.Annotations) > 0 {
		if tpl.Annotations == nil {
			tpl.Annotations = map[string]string{}
		}
		maps.Copy(tpl.Annotations, e.Annotations)
	}
}

// dcgmExporterService applies dcgmExporter.service to the exporter's
// Service: its type and internal traffic policy. ExternalName is not
// applied (a Service without endpoints of its own; reported instead).
func dcgmExporterService(svc *corev1.Service, spec *nvidiav1.ClusterPolicySpec) {
	s := spec.DCGMExporter.Service
	if s == nil {
		return
	}
	if s.Type != "" && s.Type != corev1.ServiceTypeExternalName {
		svc.Spec.Type = s.Type
	}
	if s.InternalTrafficPolicy != nil {
		svc.Spec.InternalTrafficPolicy = ptr.To(*s.InternalTrafficPolicy)
	}
}

// dcgmPod binds the standalone host engine's port on the host at
// dcgm.hostPort (deprecated in gpu-operator, which reaches the engine
// through its Service since v24.3 and ignores it; gpu-operator before
// that bound it the same way). With hostNetwork the pod's port is the
// host's, so the engine listens on hostPort itself (nv-hostengine --port).
func dcgmPod(ds *appsv1.DaemonSet, spec *nvidiav1.ClusterPolicySpec) {
	hostPort := spec.DCGM.HostPort
	if hostPort == 0 {
		return
	}
	ctr := &ds.Spec.Template.Spec.Containers[0]
	for i := range ctr.Ports {
		p := &ctr.Ports[i]
		if p.Name != "dcgm" {
			continue
		}
		p.HostPort = hostPort
		if isTrue(spec.DCGM.HostNetwork) && hostPort != p.ContainerPort {
			p.ContainerPort = hostPort
			ctr.Command = append(ctr.Command, "--port", strconv.Itoa(int(hostPort)))
		}
	}
}

// wanted reports whether an object of a component's asset is rendered for
// this policy: dcgm-exporter's pod-reader RBAC only when it reads pods.
func wanted(o client.Object, spec *nvidiav1.ClusterPolicySpec) bool {
	switch o.(type) {
	case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
		if o.GetName() == dcgmExporterPodReader {
			return dcgmExporterReadsPods(spec)
		}
	}
	return true
}
