package gpustack

import (
	"bufio"
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
)

//go:embed assets/*.yaml
var embeddedAssets embed.FS

// Assets are the manifests compiled into the binary, one file per component.
var Assets = mustSub(embeddedAssets, "assets")

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // a build-time constant path; cannot fail at run time
	}
	return sub
}

// Labels gpufleet puts on every object it renders (the first two and
// gpufleet's value of managed-by are the GPU stack's API,
// api/nvidia/v1/stack.go).
const (
	LabelManagedBy = nvidiav1.LabelManagedBy
	LabelComponent = nvidiav1.LabelComponent
	LabelPartOf    = "app.kubernetes.io/part-of"
	managedBy      = nvidiav1.ManagedBy
	partOf         = "gpufleet-gpu-stack"
	// LabelFlavour names the OS flavour or runtime of a per-node-kind DaemonSet.
	LabelFlavour = "gpufleet.dev/flavour"
)

// Facts are what the renderer needs to know about the cluster.
type Facts struct {
	// Namespace to deploy into.
	Namespace string
	// OSFlavours found among GPU nodes, one driver DaemonSet each.
	OSFlavours []OSFlavour
	// Runtimes found among GPU nodes (containerd, docker, crio), one
	// toolkit DaemonSet each.
	Runtimes []string
	// Drivers are the NVIDIADriver objects, sorted by name, when the
	// policy sets driver.useNvidiaDriverCRD: one driver DaemonSet per
	// driver and OS flavour instead of the policy's own.
	Drivers []nvidiav1alpha1.NVIDIADriver
}

// defaultImages are used when a policy leaves repository/image/version empty.
var defaultImages = map[string][3]string{
	Driver:             {"nvcr.io/nvidia", "driver", "550.127.08"},
	ContainerToolkit:   {"nvcr.io/nvidia/k8s", "container-toolkit", "v1.17.0-ubuntu20.04"},
	DevicePlugin:       {"nvcr.io/nvidia", "k8s-device-plugin", "v0.17.0"},
	Validator:          {"nvcr.io/nvidia/cloud-native", "gpu-operator-validator", "v24.9.0"},
	DCGM:               {"nvcr.io/nvidia/cloud-native", "dcgm", "3.3.9-1-ubuntu22.04"},
	DCGMExporter:       {"nvcr.io/nvidia/k8s", "dcgm-exporter", "3.3.9-3.6.1-ubuntu22.04"},
	GFD:                {"nvcr.io/nvidia", "k8s-device-plugin", "v0.17.0"},
	MIGManager:         {"nvcr.io/nvidia/cloud-native", "k8s-mig-manager", "v0.10.0-ubuntu20.04"},
	NodeStatusExporter: {"nvcr.io/nvidia/cloud-native", "gpu-operator-validator", "v24.9.0"},
	// The driver pod's init container (driver.manager).
	DriverManagerContainer: {"nvcr.io/nvidia/cloud-native", "k8s-driver-manager", "v0.7.0"},
}

// runtimePaths are the host paths and env of the toolkit per runtime.
var runtimePaths = map[string]struct{ configDir, socketDir, configEnv, config, socketEnv, socket string }{
	"containerd": {"/etc/containerd", "/run/containerd", "CONTAINERD_CONFIG", "/runtime/config-dir/config.toml", "CONTAINERD_SOCKET", "/runtime/sock-dir/containerd.sock"},
	"docker":     {"/etc/docker", "/var/run", "DOCKER_CONFIG", "/runtime/config-dir/daemon.json", "DOCKER_SOCKET", "/runtime/sock-dir/docker.sock"},
	"crio":       {"/etc/crio", "/var/run/crio", "CRIO_CONFIG", "/runtime/config-dir/crio.conf", "CRIO_SOCKET", "/runtime/sock-dir/crio.sock"},
}

// Render turns a ClusterPolicy and the cluster's facts into the objects of
// every enabled component, in rollout order. It is pure: no client, no
// clock. A malformed asset is an error, never a panic.
func Render(policy *nvidiav1.ClusterPolicy, facts Facts, assets fs.FS) ([]client.Object, error) {
	var out []client.Object
	vspec := validatorComponent().Spec(&policy.Spec)
	validator, err := imageRef(Validator, vspec)
	if err != nil {
		return nil, fmt.Errorf("component %s: %w", Validator, err)
	}
	for _, c := range nvidiav1.Components {
		if !c.Enabled(&policy.Spec) {
			continue
		}
		objs, err := decodeAsset(assets, c.Key+".yaml")
		if err != nil {
			return nil, fmt.Errorf("component %s: %w", c.Key, err)
		}
		spec := c.Spec(&policy.Spec)
		image, err := imageRef(c.Key, spec)
		if err != nil {
			return nil, fmt.Errorf("component %s: %w", c.Key, err)
		}
		for _, o := range objs {
			if !wanted(o, &policy.Spec) {
				continue
			}
			o.SetNamespace(facts.Namespace)
			if isClusterScoped(o) {
				o.SetNamespace("")
			}
			common(o, policy, c.Key)
			switch obj := o.(type) {
			case *rbacv1.ClusterRoleBinding:
				for i := range obj.Subjects {
					obj.Subjects[i].Namespace = facts.Namespace
				}
				out = append(out, obj)
			case *appsv1.DaemonSet:
				addValidations(&obj.Spec.Template.Spec, c, validator, vspec, &policy.Spec.Validator)
				dss, err := daemonSets(obj, policy, facts, c, spec, image)
				if err != nil {
					return nil, fmt.Errorf("component %s: %w", c.Key, err)
				}
				out = append(out, dss...)
			case *corev1.Service:
				if c.Key == DCGMExporter {
					dcgmExporterService(obj, &policy.Spec)
				}
				out = append(out, obj)
			default:
				out = append(out, o)
			}
		}
	}
	return out, nil
}

var codecs = serializer.NewCodecFactory(clientgoscheme.Scheme, serializer.EnableStrict)

// decodeAsset reads a multi-document YAML asset into typed objects.
func decodeAsset(assets fs.FS, name string) ([]client.Object, error) {
	data, err := fs.ReadFile(assets, name)
	if err != nil {
		return nil, fmt.Errorf("reading asset %s: %w", name, err)
	}
	var out []client.Object
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("asset %s document %d: %w", name, i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("asset %s document %d: %w", name, i, err)
		}
		co, ok := obj.(client.Object)
		if !ok {
			return nil, fmt.Errorf("asset %s document %d: %T is not an object", name, i, obj)
		}
		out = append(out, co)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("asset %s has no objects", name)
	}
	return out, nil
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func isClusterScoped(o client.Object) bool {
	switch o.(type) {
	case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
		return true
	}
	return false
}

// common sets the labels and owner every rendered object carries.
func common(o client.Object, policy *nvidiav1.ClusterPolicy, component string) {
	labels := maps.Clone(o.GetLabels())
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelManagedBy] = managedBy
	labels[LabelPartOf] = partOf
	labels[LabelComponent] = component
	o.SetLabels(labels)
	o.SetOwnerReferences([]metav1.OwnerReference{*metav1.NewControllerRef(policy, nvidiav1.GroupVersion.WithKind("ClusterPolicy"))})
}

// imageRef builds repository/image:version (or @digest).
func imageRef(component string, spec *nvidiav1.ComponentSpec) (string, error) {
	def := defaultImages[component]
	repo, image, version := spec.Repository, spec.Image, spec.Version
	if image == "" {
		image = def[1]
		if repo == "" {
			repo = def[0]
		}
	}
	if version == "" {
		version = def[2]
	}
	if strings.ContainsAny(image, " \t") || strings.ContainsAny(version, " \t/") {
		return "", fmt.Errorf("invalid image %q version %q", image, version)
	}
	ref := image
	if repo != "" {
		ref = strings.TrimSuffix(repo, "/") + "/" + image
	}
	if strings.HasPrefix(version, "sha256:") {
		return ref + "@" + version, nil
	}
	return ref + ":" + version, nil
}

// daemonSets customises a component's DaemonSet from the policy: one per
// OS flavour for the driver, one per runtime for the toolkit.
func daemonSets(base *appsv1.DaemonSet, policy *nvidiav1.ClusterPolicy, facts Facts, c Component, spec *nvidiav1.ComponentSpec, image string) ([]client.Object, error) {
	if len(base.Spec.Template.Spec.Containers) == 0 {
		return nil, fmt.Errorf("DaemonSet %s has no containers", base.Name)
	}
	if c.Key == Driver && isTrue(policy.Spec.Driver.UseNvidiaDriverCRD) {
		return nvidiaDriverDaemonSets(base, policy, facts, c)
	}
	customise(base, policy, c, spec, image)
	switch c.Key {
	case DCGMExporter:
		dcgmExporterPod(base, &policy.Spec)
		return []client.Object{base}, nil
	case DCGM:
		dcgmPod(base, &policy.Spec)
		return []client.Object{base}, nil
	case Driver:
		if err := driverPod(base, &policy.Spec.Driver); err != nil {
			return nil, err
		}
		return driverFlavours(base, "", facts, image), nil
	case ContainerToolkit:
		var out []client.Object
		for _, rt := range sorted(facts.Runtimes) {
			paths, ok := runtimePaths[rt]
			if !ok {
				return nil, fmt.Errorf("unknown container runtime %q", rt)
			}
			ds := base.DeepCopy()
			setFlavour(ds, rt)
			ds.Spec.Template.Spec.NodeSelector[LabelRuntime] = rt
			ctr := &ds.Spec.Template.Spec.Containers[0]
			ctr.Env = mergeEnv(ctr.Env, []corev1.EnvVar{
				{Name: "RUNTIME", Value: rt},
				{Name: paths.configEnv, Value: paths.config},
				{Name: paths.socketEnv, Value: paths.socket},
			})
			ctr.Env = mergeEnvUnder(ctr.Env, toolkitRuntimeEnv(&policy.Spec, rt), spec.Env)
			for i := range ds.Spec.Template.Spec.Volumes {
				v := &ds.Spec.Template.Spec.Volumes[i]
				switch v.Name {
				case "runtime-config":
					v.HostPath.Path = paths.configDir
				case "runtime-socket":
					v.HostPath.Path = paths.socketDir
				}
			}
			out = append(out, ds)
		}
		return out, nil
	default:
		return []client.Object{base}, nil
	}
}

// driverFlavours makes one driver DaemonSet per OS flavour of the GPU
// nodes (the image tag gets the OS appended, as the NVIDIA GPU Operator's
// driver images are published); prefix names the NVIDIADriver, if any.
func driverFlavours(base *appsv1.DaemonSet, prefix string, facts Facts, image string) []client.Object {
	var out []client.Object
	flavours := slices.Clone(facts.OSFlavours)
	slices.SortFunc(flavours, func(a, b OSFlavour) int { return strings.Compare(a.String(), b.String()) })
	for _, os := range slices.Compact(flavours) {
		ds := base.DeepCopy()
		setFlavour(ds, prefix+os.String())
		ds.Spec.Template.Spec.NodeSelector[labelOSID] = os.ID
		ds.Spec.Template.Spec.NodeSelector[labelOSVersion] = os.Version
		if !strings.Contains(image, "@") {
			ds.Spec.Template.Spec.Containers[0].Image = image + "-" + os.String()
		}
		// The driver is only ever replaced through NodeMaintenance.
		ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
		out = append(out, ds)
	}
	return out
}

// nvidiaDriverDaemonSets renders the driver of every NVIDIADriver (per OS
// flavour): the ClusterPolicy's settings with the driver section taken
// from the NVIDIADriver, on the nodes labelled with its name.
func nvidiaDriverDaemonSets(base *appsv1.DaemonSet, policy *nvidiav1.ClusterPolicy, facts Facts, c Component) ([]client.Object, error) {
	var out []client.Object
	for i := range facts.Drivers {
		d := &facts.Drivers[i]
		if !deployable(d) {
			continue
		}
		p := driverPolicy(policy, d)
		spec := &p.Spec.Driver.ComponentSpec
		image, err := imageRef(Driver, spec)
		if err != nil {
			return nil, fmt.Errorf("NVIDIADriver %s: %w", d.Name, err)
		}
		ds := base.DeepCopy()
		customise(ds, p, c, spec, image)
		if err := driverPod(ds, &p.Spec.Driver); err != nil {
			return nil, fmt.Errorf("NVIDIADriver %s: %w", d.Name, err)
		}
		tpl := &ds.Spec.Template
		for k, v := range driverLabelsOf(d) { // never over gpufleet's own labels
			if _, ours := tpl.Labels[k]; !ours || k == LabelNVIDIADriver {
				tpl.Labels[k] = v
			}
		}
		ds.Labels[LabelNVIDIADriver] = d.Name
		if len(d.Spec.Annotations) > 0 {
			if tpl.Annotations == nil {
				tpl.Annotations = map[string]string{}
			}
			maps.Copy(tpl.Annotations, d.Spec.Annotations)
		}
		tpl.Spec.NodeSelector[LabelNVIDIADriver] = d.Name
		if d.Spec.NodeAffinity != nil {
			tpl.Spec.Affinity = &corev1.Affinity{NodeAffinity: d.Spec.NodeAffinity.DeepCopy()}
		}
		if d.Spec.PriorityClassName != "" {
			tpl.Spec.PriorityClassName = d.Spec.PriorityClassName
		}
		if d.Spec.PodSecurityContext != nil {
			tpl.Spec.SecurityContext = d.Spec.PodSecurityContext.DeepCopy()
		}
		out = append(out, driverFlavours(ds, d.Name+"-", facts, image)...)
	}
	return out, nil
}

// addValidations starts the pod with one init container per component it
// needs on its node (Component.After), as NVIDIA's GPU Operator does: the
// validator image, COMPONENT=driver|toolkit|plugin, WITH_WAIT=true — it
// waits until that component works on the node and records it in
// /run/nvidia/validations. Every component of a node is deployed at once;
// these keep the order on each node. As in gpu-operator, they take the
// validator's pull policy, resources and pull secrets, and the env of
// validator.driver, validator.toolkit and validator.plugin (the
// validations of the same name; validator.cuda's goes to the validator's
// own container, which runs the CUDA check: componentEnv); a
// driver-validation also reads the host's root, the driver's root and
// /dev/char (driverValidationMounts).
func addValidations(ps *corev1.PodSpec, c Component, image string, vspec *nvidiav1.ComponentSpec, v *nvidiav1.ValidatorSpec) {
	if len(c.After) == 0 {
		return
	}
	const volume = "run-nvidia"
	if !slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == volume }) {
		ps.Volumes = append(ps.Volumes, corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/run/nvidia", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}})
	}
	userEnv := map[string]*nvidiav1.EnvSpec{Driver: v.Driver, ContainerToolkit: v.Toolkit, DevicePlugin: v.Plugin}
	var inits []corev1.Container
	for _, dep := range c.After {
		ctr := corev1.Container{
			Name:            validationNames[dep],
			Image:           image,
			ImagePullPolicy: pullPolicy(vspec),
			Command:         []string{"sh", "-c"},
			Args:            []string{"nvidia-validator"},
			Env: []corev1.EnvVar{
				{Name: "WITH_WAIT", Value: "true"},
				{Name: "COMPONENT", Value: validationComponent[dep]},
			},
			SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			VolumeMounts: []corev1.VolumeMount{{Name: volume, MountPath: "/run/nvidia",
				MountPropagation: ptr.To(corev1.MountPropagationBidirectional)}},
		}
		if vspec.Resources != nil {
			ctr.Resources = *vspec.Resources.DeepCopy()
		}
		if dep == Driver {
			driverValidationMounts(ps, &ctr)
		}
		if e := userEnv[dep]; e != nil {
			ctr.Env = mergeEnv(ctr.Env, envVars(e.Env))
		}
		inits = append(inits, ctr)
	}
	ps.InitContainers = append(inits, ps.InitContainers...)
	addPullSecrets(ps, vspec.ImagePullSecrets)
}

// envVars converts the policy's name/value env to the core type.
func envVars(env []nvidiav1.EnvVar) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range env {
		out = append(out, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	return out
}

// customise applies the policy's settings for the component.
func customise(ds *appsv1.DaemonSet, policy *nvidiav1.ClusterPolicy, c Component, spec *nvidiav1.ComponentSpec, image string) {
	common := policy.Spec.Daemonsets
	selector := map[string]string{"app": ds.Name}
	ds.Spec.Selector = &metav1.LabelSelector{MatchLabels: selector}
	tpl := &ds.Spec.Template
	tpl.Labels = maps.Clone(common.Labels)
	if tpl.Labels == nil {
		tpl.Labels = map[string]string{}
	}
	maps.Copy(tpl.Labels, selector)
	tpl.Labels[LabelComponent] = c.Key
	tpl.Labels[LabelManagedBy] = managedBy
	if len(common.Annotations) > 0 {
		tpl.Annotations = maps.Clone(common.Annotations)
	}
	ps := &tpl.Spec
	ps.NodeSelector = map[string]string{c.DeployLabel: valueTrue}
	for k, v := range spec.NodeSelector {
		if k != nvidiav1.LabelGPUPresent { // implied by the deploy label
			ps.NodeSelector[k] = v
		}
	}
	ps.Tolerations = nil
	for _, tol := range append(append(slices.Clone(common.Tolerations), spec.Tolerations...),
		corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}) {
		if !slices.ContainsFunc(ps.Tolerations, func(x corev1.Toleration) bool { return x.MatchToleration(&tol) }) {
			ps.Tolerations = append(ps.Tolerations, tol)
		}
	}
	if common.PriorityClassName != "" {
		ps.PriorityClassName = common.PriorityClassName
	}
	addPullSecrets(ps, spec.ImagePullSecrets)
	for i := range ps.InitContainers {
		if isValidation(ps.InitContainers[i].Name) || ps.InitContainers[i].Name == DriverManagerContainer {
			continue // the validator's image (addValidations), driver.manager's (driverPod)
		}
		ps.InitContainers[i].Image = image
		ps.InitContainers[i].ImagePullPolicy = pullPolicy(spec)
	}
	ctr := &ps.Containers[0]
	ctr.Image = image
	ctr.ImagePullPolicy = pullPolicy(spec)
	if len(spec.Args) > 0 {
		ctr.Args = slices.Clone(spec.Args)
	}
	applyHostPaths(ps, &policy.Spec)
	ctr.Env = mergeEnv(ctr.Env, componentEnv(policy, c.Key))
	ctr.Env = mergeEnv(ctr.Env, cdiEnv(&policy.Spec, c.Key))
	configMaps(ps, policy, c.Key)
	ctr.Env = mergeEnv(ctr.Env, spec.Env)
	if spec.Resources != nil {
		ctr.Resources = *spec.Resources.DeepCopy()
	}
	applySecurityContext(ctr, c, spec.SecurityContext)
	if common.PodSecurityContext != nil {
		ps.SecurityContext = common.PodSecurityContext.DeepCopy()
	}
	if isTrue(spec.HostNetwork) { // as gpu-operator's applyHostNetworkConfig
		ps.HostNetwork, ps.DNSPolicy = true, corev1.DNSClusterFirstWithHostNet
	}
	switch {
	case common.UpdateStrategy == string(appsv1.OnDeleteDaemonSetStrategyType):
		ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
	case common.RollingUpdate != nil && common.RollingUpdate.MaxUnavailable != "":
		// "1" is a number of nodes, "10%" a share (the schema allows only these).
		maxUnavailable := intstr.Parse(common.RollingUpdate.MaxUnavailable)
		ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &maxUnavailable}}
	}
}

// componentEnv carries component-specific settings of the policy.
func componentEnv(policy *nvidiav1.ClusterPolicy, key string) []corev1.EnvVar {
	switch key {
	case GFD:
		var env []corev1.EnvVar
		if s := policy.Spec.GFD.DiscoveryIntervalSeconds; s != nil {
			env = append(env, corev1.EnvVar{Name: "GFD_SLEEP_INTERVAL", Value: fmt.Sprintf("%ds", *s)})
		}
		if m := migStrategy(&policy.Spec); m != "" {
			env = append(env, corev1.EnvVar{Name: "GFD_MIG_STRATEGY", Value: m})
		}
		return env
	case DevicePlugin:
		// (A 1.x policy gives the device plugin its strategy in args.)
		if m := policy.Spec.MIG.Strategy; m != "" {
			return []corev1.EnvVar{{Name: "MIG_STRATEGY", Value: m}}
		}
	case ContainerToolkit:
		if d := policy.Spec.Toolkit.InstallDir; d != "" {
			return []corev1.EnvVar{{Name: "ROOT", Value: d}}
		}
	case DCGMExporter:
		return dcgmExporterEnv(&policy.Spec)
	case Validator:
		// The validator's container runs the CUDA check (gpu-operator's
		// cuda-validation); validator.env comes after, for the same names.
		if e := policy.Spec.Validator.CUDA; e != nil {
			return envVars(e.Env)
		}
	}
	return nil
}

// configMaps mounts the ConfigMaps a policy names into a component's main
// container, where gpu-operator mounts them: dcgmExporter.config (the
// metrics to export, key dcgm-metrics.csv) and migManager.config (the
// mig-parted configuration, key config.yaml).
func configMaps(ps *corev1.PodSpec, policy *nvidiav1.ClusterPolicy, key string) {
	ctr := &ps.Containers[0]
	mount := func(volume, configMap string, items []corev1.KeyToPath, m corev1.VolumeMount, env corev1.EnvVar) {
		ps.Volumes = append(ps.Volumes, corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: configMap}, Items: items}}})
		m.Name, m.ReadOnly = volume, true
		ctr.VolumeMounts = append(ctr.VolumeMounts, m)
		ctr.Env = mergeEnv(ctr.Env, []corev1.EnvVar{env})
	}
	switch key {
	case DCGMExporter:
		if cfg := policy.Spec.DCGMExporter.Config; cfg != nil && cfg.Name != "" {
			const file, path = "dcgm-metrics.csv", "/etc/dcgm-exporter/dcgm-metrics.csv"
			mount("metrics-config", cfg.Name, []corev1.KeyToPath{{Key: file, Path: file}},
				corev1.VolumeMount{MountPath: path, SubPath: file}, corev1.EnvVar{Name: "DCGM_EXPORTER_COLLECTORS", Value: path})
		}
	case MIGManager:
		if cfg := policy.Spec.MIGManager.Config; cfg != nil && cfg.Name != "" {
			mount("mig-parted-config", cfg.Name, nil, corev1.VolumeMount{MountPath: "/mig-parted-config"},
				corev1.EnvVar{Name: "CONFIG_FILE", Value: "/mig-parted-config/config.yaml"})
		}
	}
}

// migStrategy is spec.mig.strategy, or the 1.x place gfd.migStrategy.
func migStrategy(s *nvidiav1.ClusterPolicySpec) string {
	if s.GFD.MigStrategy != "" {
		return s.GFD.MigStrategy
	}
	return s.MIG.Strategy
}

func isValidation(name string) bool {
	for _, n := range validationNames {
		if n == name {
			return true
		}
	}
	return false
}

func pullPolicy(spec *nvidiav1.ComponentSpec) corev1.PullPolicy {
	if spec.ImagePullPolicy != "" {
		return spec.ImagePullPolicy
	}
	return corev1.PullIfNotPresent
}

// mergeEnv overrides base entries by name and appends new ones.
func mergeEnv(base, extra []corev1.EnvVar) []corev1.EnvVar {
	out := slices.Clone(base)
	for _, e := range extra {
		if i := slices.IndexFunc(out, func(x corev1.EnvVar) bool { return x.Name == e.Name }); i >= 0 {
			out[i] = e
		} else {
			out = append(out, e)
		}
	}
	return out
}

func setFlavour(ds *appsv1.DaemonSet, flavour string) {
	ds.Name = ds.Name + "-" + flavour
	ds.Labels[LabelFlavour] = flavour
	ds.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": ds.Name}}
	ds.Spec.Template.Labels["app"] = ds.Name
	ds.Spec.Template.Labels[LabelFlavour] = flavour
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return slices.Compact(out)
}
