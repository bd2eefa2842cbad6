package gpustack

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/kubectl/pkg/util/podutils"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
)

// NVIDIADriver objects (driver.useNvidiaDriverCRD): one driver per node
// pool. Each GPU node belongs to at most one driver; the node carries the
// driver's name in LabelNVIDIADriver, and that driver's DaemonSets select
// the label. A node two drivers select gets no label, so neither driver
// touches it, and both report the conflict.
const (
	// LabelNVIDIADriver names the NVIDIADriver that owns the node's driver.
	LabelNVIDIADriver = "gpufleet.dev/nvidia-driver"

	ReasonDriverConflict = "NodesSelectedTwice"
	ReasonDriverDisabled = "NVIDIADriverCRDDisabled"
)

// DriverAssignment is which NVIDIADriver each GPU node belongs to.
type DriverAssignment struct {
	// Node maps a GPU node to its driver.
	Node map[string]string
	// Conflicts maps a GPU node that more than one driver selects to
	// those drivers (sorted); such a node is in Node under none of them.
	Conflicts map[string][]string
}

// AssignDrivers decides, for every GPU node, its NVIDIADriver (pure): the
// one non-default driver whose nodeSelector matches; else the one default
// driver. Two matching non-default drivers, or two defaults for a node no
// other driver matches, are a conflict. Drivers being deleted select
// nothing.
func AssignDrivers(drivers []nvidiav1alpha1.NVIDIADriver, nodes []corev1.Node) DriverAssignment {
	a := DriverAssignment{Node: map[string]string{}, Conflicts: map[string][]string{}}
	var defaults []string
	type sel struct {
		name string
		s    labels.Selector
	}
	var selectors []sel
	for i := range drivers {
		d := &drivers[i]
		if d.DeletionTimestamp != nil {
			continue
		}
		if d.Spec.Default {
			defaults = append(defaults, d.Name)
			continue
		}
		selectors = append(selectors, sel{d.Name, labels.SelectorFromSet(d.Spec.NodeSelector)})
	}
	slices.Sort(defaults)
	slices.SortFunc(selectors, func(x, y sel) int { return strings.Compare(x.name, y.name) })
	for i := range nodes {
		n := &nodes[i]
		if !nvidiav1.HasNvidiaGPU(n.Labels) || n.DeletionTimestamp != nil {
			continue
		}
		var match []string
		for _, s := range selectors {
			if s.s.Matches(labels.Set(n.Labels)) {
				match = append(match, s.name)
			}
		}
		if len(match) == 0 {
			match = defaults
		}
		switch len(match) {
		case 0:
		case 1:
			a.Node[n.Name] = match[0]
		default:
			a.Conflicts[n.Name] = slices.Clone(match)
		}
	}
	return a
}

// NodesOf lists the nodes assigned to driver, sorted.
func (a DriverAssignment) NodesOf(driver string) []string {
	var out []string
	for n, d := range a.Node {
		if d == driver {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// ConflictsOf lists the nodes driver selects together with another, sorted.
func (a DriverAssignment) ConflictsOf(driver string) []string {
	var out []string
	for n, ds := range a.Conflicts {
		if slices.Contains(ds, driver) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// DriverLabel is the change of LabelNVIDIADriver a node needs (nil value
// = remove): its driver's name when the policy hands the driver to
// NVIDIADriver objects, else none.
func DriverLabel(node *corev1.Node, crdOn bool, a DriverAssignment) map[string]*string {
	want, ok := "", false
	if crdOn {
		want, ok = a.Node[node.Name]
	}
	have, has := node.Labels[LabelNVIDIADriver]
	switch {
	case ok && (!has || have != want):
		return map[string]*string{LabelNVIDIADriver: &want}
	case !ok && has:
		return map[string]*string{LabelNVIDIADriver: nil}
	}
	return nil
}

// deployable reports whether gpufleet deploys the driver (not being
// deleted, driverType gpu).
func deployable(d *nvidiav1alpha1.NVIDIADriver) bool {
	return d.DeletionTimestamp == nil && (d.Spec.DriverType == "" || d.Spec.DriverType == nvidiav1alpha1.DriverTypeGPU)
}

// driverPolicy is the ClusterPolicy as the driver d sees it: the policy's
// other settings, with the driver section taken from d. The renderer and
// the upgrade use it as they use the policy itself.
func driverPolicy(policy *nvidiav1.ClusterPolicy, d *nvidiav1alpha1.NVIDIADriver) *nvidiav1.ClusterPolicy {
	p := policy.DeepCopy()
	s := d.Spec.DeepCopy()
	var res *corev1.ResourceRequirements
	if s.Resources != nil {
		res = &corev1.ResourceRequirements{Limits: s.Resources.Limits, Requests: s.Resources.Requests}
	}
	env := make([]corev1.EnvVar, 0, len(s.Env))
	for _, e := range s.Env {
		env = append(env, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	p.Spec.Driver = nvidiav1.DriverSpec{
		ComponentSpec: nvidiav1.ComponentSpec{
			Enabled: policy.Spec.Driver.Enabled, Repository: s.Repository, Image: s.Image, Version: s.Version,
			ImagePullPolicy: s.ImagePullPolicy, ImagePullSecrets: s.ImagePullSecrets, Args: s.Args, Env: env,
			Resources: res, Tolerations: s.Tolerations, HostNetwork: s.HostNetwork,
		},
		UseNvidiaDriverCRD: policy.Spec.Driver.UseNvidiaDriverCRD,
		UsePrecompiled:     s.UsePrecompiled, UseOpenKernelModules: s.UseOpenKernelModules, KernelModuleType: s.KernelModuleType,
		StartupProbe: s.StartupProbe, LivenessProbe: s.LivenessProbe, ReadinessProbe: s.ReadinessProbe,
		RDMA: s.GPUDirectRDMA, Manager: &s.Manager,
		RepoConfig: repoConfig(s.RepoConfig), CertConfig: s.CertConfig, KernelModuleConfig: s.KernelModuleConfig, SecretEnv: s.SecretEnv,
	}
	p.Spec.Driver.UpgradePolicy = driverUpgradePolicy(policy, d)
	return p
}

// driverUpgradePolicy is the upgrade policy of d's nodes: its own, else
// the ClusterPolicy's.
func driverUpgradePolicy(policy *nvidiav1.ClusterPolicy, d *nvidiav1alpha1.NVIDIADriver) *nvidiav1.DriverUpgradePolicySpec {
	if d.Spec.UpgradePolicy != nil {
		return d.Spec.UpgradePolicy
	}
	return policy.Spec.Driver.UpgradePolicy
}

func repoConfig(r *nvidiav1.NameRef) *nvidiav1.ConfigMapRef {
	if r == nil {
		return nil
	}
	return &nvidiav1.ConfigMapRef{ConfigMapName: r.Name}
}

// NVIDIADriverUnsupported lists the fields of d that turn on what gpufleet
// does not provide (pure), as UnsupportedFields does for the policy.
func NVIDIADriverUnsupported(d *nvidiav1alpha1.NVIDIADriver) []UnsupportedField {
	var out []UnsupportedField
	add := func(on bool, path, feature string) {
		if on {
			out = append(out, UnsupportedField{Path: "spec." + path, Feature: feature})
		}
	}
	s := &d.Spec
	add(!deployable(d) && d.DeletionTimestamp == nil, "driverType", "vGPU drivers ("+string(s.DriverType)+"); nothing is deployed")
	add(isTrue(s.UsePrecompiled), "usePrecompiled", "precompiled driver modules")
	add(s.GPUDirectRDMA != nil && isTrue(s.GPUDirectRDMA.Enabled), "rdma.enabled", "GPUDirect RDMA")
	add(s.GPUDirectStorage != nil && isTrue(s.GPUDirectStorage.Enabled), "gds.enabled", "GPUDirect Storage")
	add(s.GDRCopy != nil && isTrue(s.GDRCopy.Enabled), "gdrcopy.enabled", "GDRCopy")
	add(s.LicensingConfig != nil && (s.LicensingConfig.SecretName != "" || s.LicensingConfig.Name != ""), "licensingConfig", "vGPU licensing")
	add(s.VirtualTopologyConfig != nil && s.VirtualTopologyConfig.Name != "", "virtualTopologyConfig", "vGPU virtual topology")
	out = append(out, driverUnsupported("", s.LivenessProbe, "repoConfig.name", nameOf(s.RepoConfig), nameOf(s.CertConfig), &s.Manager)...)
	return out
}

// DriverStatus computes an NVIDIADriver's status (pure). pods are the
// stack's driver pods; desired maps a driver DaemonSet (its app label) to
// the image it should run. The status keeps the old conditions' transition
// times when nothing changed.
func DriverStatus(d *nvidiav1alpha1.NVIDIADriver, crdOn bool, a DriverAssignment, pods []corev1.Pod, desired map[string]string, ns string, now metav1.Time) nvidiav1alpha1.NVIDIADriverStatus {
	st := *d.Status.DeepCopy()
	st.Namespace = ns
	set := func(typ string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg,
			ObservedGeneration: d.Generation, LastTransitionTime: now})
	}
	if unsupported := NVIDIADriverUnsupported(d); len(unsupported) > 0 {
		names := make([]string, 0, len(unsupported))
		for _, f := range unsupported {
			names = append(names, f.String())
		}
		set(nvidiav1.ConditionUnsupportedFields, metav1.ConditionTrue, ReasonUnsupportedFields,
			"not provided by gpufleet, not deployed: "+strings.Join(names, ", "))
	} else {
		meta.RemoveStatusCondition(&st.Conditions, nvidiav1.ConditionUnsupportedFields)
	}
	if !crdOn {
		st.State, st.Nodes, st.NodesReady = nvidiav1alpha1.StateDisabled, 0, 0
		set(nvidiav1.ConditionReady, metav1.ConditionFalse, ReasonDriverDisabled,
			"the active ClusterPolicy does not set driver.useNvidiaDriverCRD: true; its own driver section applies")
		meta.RemoveStatusCondition(&st.Conditions, nvidiav1alpha1.ConditionConflict)
		return st
	}
	nodes := a.NodesOf(d.Name)
	st.Nodes = int32(len(nodes))
	ready := 0
	mine := map[string]bool{}
	for _, n := range nodes {
		mine[n] = true
	}
	var notReady []string
	readyOn := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if p.Labels[LabelNVIDIADriver] != d.Name || !mine[p.Spec.NodeName] || p.DeletionTimestamp != nil || len(p.Spec.Containers) == 0 {
			continue
		}
		if want, ok := desired[p.Labels["app"]]; ok && p.Spec.Containers[0].Image == want && podutils.IsPodReady(p) {
			readyOn[p.Spec.NodeName] = true
		}
	}
	for _, n := range nodes {
		if readyOn[n] {
			ready++
		} else {
			notReady = append(notReady, n)
		}
	}
	st.NodesReady = int32(ready)
	if c := a.ConflictsOf(d.Name); len(c) > 0 {
		set(nvidiav1alpha1.ConditionConflict, metav1.ConditionTrue, ReasonDriverConflict,
			fmt.Sprintf("%d node(s) also selected by another NVIDIADriver get no driver from either: %s", len(c), summarize(c, 10)))
	} else {
		meta.RemoveStatusCondition(&st.Conditions, nvidiav1alpha1.ConditionConflict)
	}
	switch {
	case !deployable(d):
		st.State = nvidiav1alpha1.StateNotReady
		set(nvidiav1.ConditionReady, metav1.ConditionFalse, ReasonUnsupportedFields, "driverType "+string(d.Spec.DriverType)+" is not deployed by gpufleet")
	case len(notReady) == 0:
		st.State = nvidiav1alpha1.StateReady
		set(nvidiav1.ConditionReady, metav1.ConditionTrue, "DriverReady", fmt.Sprintf("driver ready on %d node(s)", ready))
	default:
		st.State = nvidiav1alpha1.StateNotReady
		set(nvidiav1.ConditionReady, metav1.ConditionFalse, "DriverNotReady",
			fmt.Sprintf("driver not ready (or not current) on %d of %d node(s): %s", len(notReady), len(nodes), summarize(notReady, 10)))
	}
	return st
}

// driverLabelsOf returns the pod template labels a driver adds (its own
// labels, then the driver name).
func driverLabelsOf(d *nvidiav1alpha1.NVIDIADriver) map[string]string {
	out := maps.Clone(d.Spec.Labels)
	if out == nil {
		out = map[string]string{}
	}
	out[LabelNVIDIADriver] = d.Name
	return out
}
