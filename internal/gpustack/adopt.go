package gpustack

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// Taking over a GPU stack another operator left (NVIDIA's GPU Operator):
// gpufleet adopts the other operator's DaemonSets instead of starting its
// own beside them, so that there is never a second DaemonSet of one
// component on a node (two drivers would fight over the kernel module).
// An adopted DaemonSet keeps its name and its selector (immutable); its pod
// template is kept as long as it runs what the policy asks for (the same
// images), so that no pod restarts on a takeover. Only a later change of
// the rendered template (a policy edit) replaces it, and the driver's
// DaemonSet is OnDelete: its pods are only ever replaced through a
// NodeMaintenance (upgrade.go).

// Annotations on an adopted DaemonSet.
const (
	// AnnotationAdoptedFrom names the operator a DaemonSet was adopted from.
	AnnotationAdoptedFrom = "gpufleet.dev/adopted-from"
	// AnnotationAcceptedTemplate is the hash of the rendered pod template
	// that the live template (kept on adoption) stands for; while the
	// rendered template is unchanged, the live one is current.
	AnnotationAcceptedTemplate = "gpufleet.dev/accepted-template"
	// AnnotationPreviousHash is the GPU Operator's record of what it
	// applied. Removed on adoption: without it, the GPU Operator rewrites
	// the DaemonSet from its own template when it is back (a way back).
	AnnotationPreviousHash = "nvidia.com/last-applied-hash"
)

// previousOperator is how an adopted DaemonSet's former owner is named.
const previousOperator = "gpu-operator"

// isOurs reports whether an object carries gpufleet's managed-by label.
func isOurs(labels map[string]string) bool { return labels[LabelManagedBy] == managedBy }

// liveComponent is the component of a live DaemonSet ("" none of the stack's).
func liveComponent(ds *appsv1.DaemonSet) string {
	if isOurs(ds.Labels) {
		return ds.Labels[LabelComponent]
	}
	return nvidiav1.OperatorComponent(ds.Name, ds.Labels)
}

// Adoption is one rendered DaemonSet that takes over a live one of
// another operator (or one adopted before).
type Adoption struct {
	Component string
	// Rendered is the name gpufleet renders on an empty cluster.
	Rendered string
	// Live is the adopted DaemonSet's name, kept.
	Live string
	// From is the operator it was adopted from ("" adopted before).
	From string
}

// Blocked is a component gpufleet does not deploy because another
// operator's DaemonSets run it and gpufleet cannot tell which of its own
// each replaces.
type Blocked struct {
	Component string
	Live      []string
	Rendered  []string
}

func (b Blocked) String() string {
	return fmt.Sprintf("%s: DaemonSet %s of another operator runs it, and gpufleet renders %s for it: not started beside it (remove the other DaemonSets, or leave only one)",
		b.Component, strings.Join(b.Live, ", "), strings.Join(b.Rendered, ", "))
}

// Adopt maps the rendered objects onto the live DaemonSets of the stack's
// namespace (pure). A rendered DaemonSet whose component already runs in a
// DaemonSet of another operator (or in one gpufleet adopted before) takes
// that DaemonSet's name and selector, so that it is updated rather than a
// second one created; when gpufleet renders several DaemonSets for a
// component and cannot tell which one another operator's DaemonSet
// replaces, none of that component's is rendered (Blocked). The result
// keeps the order of rendered.
func Adopt(rendered []client.Object, live []appsv1.DaemonSet) ([]client.Object, []Adoption, []Blocked) {
	byName := map[string]*appsv1.DaemonSet{}
	foreign := map[string][]*appsv1.DaemonSet{} // by component
	adopted := map[string]*appsv1.DaemonSet{}   // gpufleet's adopted ones, by component/flavour
	for i := range live {
		ds := &live[i]
		if ds.DeletionTimestamp != nil {
			continue
		}
		byName[ds.Name] = ds
		c := liveComponent(ds)
		switch {
		case c == "":
		case !isOurs(ds.Labels):
			foreign[c] = append(foreign[c], ds)
		case ds.Annotations[AnnotationAdoptedFrom] != "":
			adopted[c+"/"+ds.Labels[LabelFlavour]] = ds
		}
	}
	renderedOf := map[string][]*appsv1.DaemonSet{}
	for _, o := range rendered {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			c := ds.Labels[LabelComponent]
			renderedOf[c] = append(renderedOf[c], ds)
		}
	}
	target := map[string]*appsv1.DaemonSet{} // rendered name → live DaemonSet it becomes
	from := map[string]string{}
	var blocked []Blocked
	for _, c := range sortedKeys(renderedOf) {
		dss := renderedOf[c]
		for _, ds := range dss {
			if a := adopted[c+"/"+ds.Labels[LabelFlavour]]; a != nil {
				target[ds.Name] = a
			} else if l := byName[ds.Name]; l != nil && !isOurs(l.Labels) {
				target[ds.Name] = l // the same name: adopted in place
				from[ds.Name] = previousOperator
			}
		}
		var left []*appsv1.DaemonSet // foreign DaemonSets not yet matched
		for _, f := range foreign[c] {
			if !slices.ContainsFunc(dss, func(ds *appsv1.DaemonSet) bool { return target[ds.Name] == f }) {
				left = append(left, f)
			}
		}
		var free []*appsv1.DaemonSet // rendered ones not yet mapped
		for _, ds := range dss {
			if target[ds.Name] == nil {
				free = append(free, ds)
			}
		}
		left = slices.DeleteFunc(left, func(f *appsv1.DaemonSet) bool { return otherDriversOwn(f, dss) })
		matched := matchBySelector(left, free)
		switch {
		case len(left) == 0:
		case len(left) == 1 && len(free) == 1:
			target[free[0].Name] = left[0]
			from[free[0].Name] = previousOperator
		case matched != nil:
			for name, f := range matched {
				target[name] = f
				from[name] = previousOperator
			}
		default:
			b := Blocked{Component: c}
			for _, l := range left {
				b.Live = append(b.Live, l.Name)
			}
			for _, ds := range free {
				b.Rendered = append(b.Rendered, ds.Name)
			}
			sort.Strings(b.Live)
			blocked = append(blocked, b)
		}
	}
	isBlocked := map[string]bool{}
	for _, b := range blocked {
		for _, n := range b.Rendered {
			isBlocked[n] = true
		}
	}
	var out []client.Object
	var adoptions []Adoption
	for _, o := range rendered {
		ds, ok := o.(*appsv1.DaemonSet)
		if !ok {
			out = append(out, o)
			continue
		}
		if isBlocked[ds.Name] {
			continue
		}
		l := target[ds.Name]
		if l == nil {
			out = append(out, o)
			continue
		}
		adoptions = append(adoptions, Adoption{Component: ds.Labels[LabelComponent], Rendered: ds.Name, Live: l.Name, From: from[ds.Name]})
		out = append(out, adoptedAs(ds, l))
	}
	return out, adoptions, blocked
}

// labelKernel is Node Feature Discovery's kernel label, on the node
// selector of the GPU Operator's precompiled drivers (one per kernel).
const labelKernel = "feature.node.kubernetes.io/kernel-version.full"

// nvidiaDriverOf is the NVIDIADriver that owns another operator's
// DaemonSet (the GPU Operator's NVIDIADriver mode), "" none.
func nvidiaDriverOf(ds *appsv1.DaemonSet) string {
	for _, ref := range ds.OwnerReferences {
		if ref.Kind == "NVIDIADriver" && ptr.Deref(ref.Controller, false) {
			return ref.Name
		}
	}
	return ""
}

// otherDriversOwn: f is the DaemonSet of an NVIDIADriver none of the
// rendered DaemonSets dss stands for (one gpufleet does not deploy, such
// as a vGPU driver): left as it is, and no reason to hold the others back.
func otherDriversOwn(f *appsv1.DaemonSet, dss []*appsv1.DaemonSet) bool {
	d := nvidiaDriverOf(f)
	return d != "" && !slices.ContainsFunc(dss, func(ds *appsv1.DaemonSet) bool { return ds.Labels[LabelNVIDIADriver] == d })
}

// correspond: the other operator's DaemonSet f runs on exactly the nodes of
// the rendered r: the same OS (ID and version) in both node selectors, the
// same NVIDIADriver (f's owner, r's label), and f not per kernel (gpufleet
// renders no precompiled driver per kernel).
func correspond(f, r *appsv1.DaemonSet) bool {
	fs, rs := f.Spec.Template.Spec.NodeSelector, r.Spec.Template.Spec.NodeSelector
	for _, k := range []string{labelOSID, labelOSVersion} {
		if fs[k] == "" || fs[k] != rs[k] {
			return false
		}
	}
	return fs[labelKernel] == "" && nvidiaDriverOf(f) == r.Labels[LabelNVIDIADriver]
}

// matchBySelector maps each of the other operator's DaemonSets left onto
// the one rendered DaemonSet of free that runs on the same nodes (the GPU
// Operator's per-OS drivers of NVIDIADriver mode): rendered name → live
// DaemonSet, or nil unless every one of left has exactly one, each its
// own (anything less could run two drivers on some node).
func matchBySelector(left, free []*appsv1.DaemonSet) map[string]*appsv1.DaemonSet {
	if len(left) == 0 {
		return nil
	}
	out := map[string]*appsv1.DaemonSet{}
	for _, f := range left {
		var hit *appsv1.DaemonSet
		for _, r := range free {
			if correspond(f, r) {
				if hit != nil {
					return nil
				}
				hit = r
			}
		}
		if hit == nil || out[hit.Name] != nil {
			return nil
		}
		out[hit.Name] = f
	}
	return out
}

// adoptedAs is the rendered DaemonSet ds as the live DaemonSet l it takes
// over: l's name and selector (immutable), with the selector's labels on
// the pod template (which must match it).
func adoptedAs(ds *appsv1.DaemonSet, l *appsv1.DaemonSet) *appsv1.DaemonSet {
	out := ds.DeepCopy()
	out.Name = l.Name
	if l.Spec.Selector != nil {
		out.Spec.Selector = l.Spec.Selector.DeepCopy()
		if out.Spec.Template.Labels == nil {
			out.Spec.Template.Labels = map[string]string{}
		}
		maps.Copy(out.Spec.Template.Labels, l.Spec.Selector.MatchLabels)
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	from := l.Annotations[AnnotationAdoptedFrom]
	if from == "" {
		from = previousOperator
	}
	out.Annotations[AnnotationAdoptedFrom] = from
	return out
}

// runsWhatIsAsked reports whether a live pod template runs what the
// rendered one asks for: every rendered container is there, by name, with
// the same image (differences in labels, annotations, environment or
// gpufleet's own bookkeeping do not count). Such a template is kept on
// adoption: replacing it would restart every pod for nothing.
func runsWhatIsAsked(want, have *corev1.PodTemplateSpec) bool {
	for _, w := range want.Spec.Containers {
		i := slices.IndexFunc(have.Spec.Containers, func(h corev1.Container) bool { return h.Name == w.Name })
		if i < 0 || have.Spec.Containers[i].Image != w.Image {
			return false
		}
	}
	return len(want.Spec.Containers) > 0
}

func sortedKeys[V any](m map[string]V) []string {
	keys := slices.Collect(maps.Keys(m))
	sort.Strings(keys)
	return keys
}

// LiveTemplateKept reports whether writing the rendered DaemonSet want
// (as Adopt returns it) over the live DaemonSet have keeps have's pod
// template, so that none of its pods restarts: the template runs what the
// policy asks for (taken over from another operator), or gpufleet
// accepted it for this rendered template before.
func LiveTemplateKept(want, have *appsv1.DaemonSet) bool {
	return takeOver(want, have).Annotations[AnnotationAcceptedTemplate] != ""
}
