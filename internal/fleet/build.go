package fleet

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	resourcehelper "k8s.io/component-helpers/resource"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// The apiVersion and kind of the view and of a node's story in -o json|yaml.
var (
	FleetGVK = schema.GroupVersionKind{Group: "gpufleet.dev", Version: "v1alpha1", Kind: "FleetStatus"}
	StoryGVK = schema.GroupVersionKind{Group: "gpufleet.dev", Version: "v1alpha1", Kind: "NodeStory"}
)

// stackNames are the short names of the GPU-stack components.
var stackNames = map[string]string{
	nvidiav1.Driver:             "driver",
	nvidiav1.ContainerToolkit:   "toolkit",
	nvidiav1.DevicePlugin:       "plugin",
	nvidiav1.Validator:          "validator",
	nvidiav1.DCGM:               "dcgm",
	nvidiav1.DCGMExporter:       "exporter",
	nvidiav1.GFD:                "gfd",
	nvidiav1.MIGManager:         "mig",
	nvidiav1.NodeStatusExporter: "status-exporter",
}

// stackPod is what the view needs of a GPU-stack pod.
type stackPod struct {
	ready bool
	since time.Time // not Ready since
}

// index holds the snapshot's objects by node name.
type index struct {
	inUse        map[string]int64
	sliceGPUs    map[string]int64
	stack        map[string]map[string]stackPod // node -> component -> pod
	maintenances map[string][]*maintenancev1.NodeMaintenance
	repairs      map[string][]*repairv1.NodeRepair
	faults       map[string][]*repairv1.GPUFault
}

func newIndex(s *Snapshot) *index {
	ix := &index{
		inUse: map[string]int64{}, sliceGPUs: map[string]int64{}, stack: map[string]map[string]stackPod{},
		maintenances: map[string][]*maintenancev1.NodeMaintenance{}, repairs: map[string][]*repairv1.NodeRepair{},
		faults: map[string][]*repairv1.GPUFault{},
	}
	for _, p := range s.Pods {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if comp := nvidiav1.PodComponent(p.Labels); comp != "" && p.DeletionTimestamp == nil {
			if ix.stack[p.Spec.NodeName] == nil {
				ix.stack[p.Spec.NodeName] = map[string]stackPod{}
			}
			ix.stack[p.Spec.NodeName][comp] = podReadiness(p)
		}
		if asksForGPUs(p) {
			reqs := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
			if q, ok := reqs[ResourceGPU]; ok {
				ix.inUse[p.Spec.NodeName] += q.Value()
			}
		}
	}
	for _, c := range s.Claims {
		node, n := claimGPUs(c)
		if node != "" {
			ix.inUse[node] += n
		}
	}
	for _, sl := range s.Slices {
		if sl.Spec.Driver == DRADriver && sl.Spec.NodeName != nil {
			ix.sliceGPUs[*sl.Spec.NodeName] += int64(len(sl.Spec.Devices))
		}
	}
	for _, nm := range s.Maintenances {
		ix.maintenances[nm.Spec.NodeName] = append(ix.maintenances[nm.Spec.NodeName], nm)
	}
	for _, r := range s.Repairs {
		ix.repairs[r.Spec.NodeName] = append(ix.repairs[r.Spec.NodeName], r)
	}
	for _, f := range s.Faults {
		ix.faults[f.Spec.NodeName] = append(ix.faults[f.Spec.NodeName], f)
	}
	return ix
}

// asksForGPUs reports whether a container of the pod requests GPUs: most
// pods do not, and need no adding up.
func asksForGPUs(p *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{p.Spec.Containers, p.Spec.InitContainers} {
		for i := range cs {
			if _, ok := cs[i].Resources.Requests[ResourceGPU]; ok {
				return true
			}
		}
	}
	return false
}

func podReadiness(p *corev1.Pod) stackPod {
	sp := stackPod{since: p.CreationTimestamp.Time}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			sp.ready = c.Status == corev1.ConditionTrue
			if !sp.ready && !c.LastTransitionTime.IsZero() {
				sp.since = c.LastTransitionTime.Time
			}
		}
	}
	return sp
}

// ClaimNode is the node where a claim's devices of NVIDIA's DRA driver are
// allocated ("": not allocated).
func ClaimNode(c *resourcev1.ResourceClaim) string {
	node, _ := claimGPUs(c)
	return node
}

// claimGPUs returns the node of an allocated claim and how many devices of
// NVIDIA's DRA driver it holds there.
func claimGPUs(c *resourcev1.ResourceClaim) (string, int64) {
	a := c.Status.Allocation
	if a == nil {
		return "", 0
	}
	var n int64
	node := ""
	for _, r := range a.Devices.Results {
		if r.Driver == DRADriver {
			n++
			node = r.Pool // node-local drivers name their pool after the node
		}
	}
	if a.NodeSelector != nil {
		for _, t := range a.NodeSelector.NodeSelectorTerms {
			for _, f := range t.MatchFields {
				if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
					node = f.Values[0]
				}
			}
		}
	}
	return node, n
}

// Build turns a snapshot into the fleet view at now: a row per node,
// sorted by name, and the summary. With spec.domains in s.Config, the rows
// are grouped by domain (nodes in no domain last) and each domain is
// summarised.
func Build(s *Snapshot, now time.Time) *Fleet {
	poolLabel := s.PoolLabel
	if poolLabel == "" {
		poolLabel = DefaultPoolLabel
	}
	ix := newIndex(s)
	f := &Fleet{Rows: make([]Row, 0, len(s.Nodes)), Summary: Summary{Pools: map[string]int{}}, DomainLabel: DomainLabel(s.Config)}
	f.SetGroupVersionKind(FleetGVK)
	var cdNames map[string]string
	if f.DomainLabel != "" {
		cdNames = computeDomainNames(s.ComputeDomains)
	}
	for _, n := range s.Nodes {
		r := buildRow(s, ix, n, poolLabel, now)
		if f.DomainLabel != "" {
			r.Domain = n.Labels[f.DomainLabel]
			if uid := n.Labels[LabelComputeDomain]; uid != "" {
				r.ComputeDomain = &ComputeDomainRef{UID: uid, Name: cdNames[uid]}
			}
		}
		f.Rows = append(f.Rows, r)
	}
	SortRows(f.Rows, f.DomainLabel != "")
	if f.DomainLabel != "" {
		f.Domains = Domains(f.Rows)
	}
	f.Summary = Summarize(f.Rows)
	f.Notes = Notes(s.Unavailable)
	return f
}

// SortRows orders rows as Build does: by node name, grouped by domain
// (nodes in no domain last) when byDomain.
func SortRows(rows []Row, byDomain bool) {
	slices.SortFunc(rows, func(a, b Row) int { return strings.Compare(a.Node, b.Node) })
	if byDomain {
		groupByDomain(rows)
	}
}

// Notes is a sentence per kind that could not be read, sorted.
func Notes(unavailable map[Kind]string) []string {
	var notes []string
	for k, why := range unavailable {
		notes = append(notes, fmt.Sprintf("%s: %s", k, why))
	}
	sort.Strings(notes)
	return notes
}

// Summarize counts rows by state.
func Summarize(rows []Row) Summary {
	sum := Summary{Pools: map[string]int{}}
	for i := range rows {
		sum.Add(&rows[i], 1)
	}
	return sum
}

// Add counts row r into the summary (sign 1), or takes it out (sign -1):
// a view that changes a few rows keeps its summary without counting every
// row again.
func (sum *Summary) Add(r *Row, sign int) {
	if sum.Pools == nil {
		sum.Pools = map[string]int{}
	}
	n, n64 := sign, int64(sign)
	sum.Nodes += n
	if sum.Pools[r.Pool] += n; sum.Pools[r.Pool] == 0 {
		delete(sum.Pools, r.Pool)
	}
	sum.GPUs += n64 * r.GPUs.Capacity
	if r.GPUs.InUse != nil {
		sum.GPUsInUse += n64 * *r.GPUs.InUse
	}
	if r.GPUs.Faulty != nil {
		sum.GPUsFaulty += n64 * *r.GPUs.Faulty
	}
	switch r.State {
	case StateReady:
		sum.ReadyForWork += n
	case StateDraining:
		sum.Draining += n
		sum.InMaintenance += n
	case StateInMaintenance:
		sum.InMaintenance += n
	case StateRecoveryFailed:
		sum.RecoveryFailed += n
		sum.Repairing += n
	case StateRepairing:
		sum.Repairing += n
	case StateNotReady:
		sum.NotReady += n
		sum.Degraded += n
	case StateDegradedStack:
		sum.DegradedStack += n
		sum.Degraded += n
	case StateCordoned:
		sum.Cordoned += n
	}
}

func buildRow(s *Snapshot, ix *index, n *corev1.Node, poolLabel string, now time.Time) Row {
	r := Row{
		Node: n.Name, Pool: n.Labels[poolLabel], Ready: nodeReady(n), Unschedulable: n.Spec.Unschedulable,
		Created: n.CreationTimestamp, DriverUpgrade: n.Labels[nvidiav1.LabelUpgradeState],
	}
	r.GPUs.Capacity = quantity(n.Status.Capacity, ResourceGPU)
	r.GPUs.Allocatable = quantity(n.Status.Allocatable, ResourceGPU)
	if g := ix.sliceGPUs[n.Name]; g > r.GPUs.Capacity {
		// GPUs published only through DRA: allocatable unless faulty.
		r.GPUs.Capacity, r.GPUs.Allocatable = g, g
	}
	if _, missing := s.Unavailable[KindPod]; !missing {
		v := ix.inUse[n.Name]
		r.GPUs.InUse = &v
	}
	if _, missing := s.Unavailable[KindGPUFault]; !missing {
		var v int64
		for _, f := range ix.faults[n.Name] {
			if !f.InService() {
				v++
			}
		}
		r.GPUs.Faulty = &v
	}
	r.Stack, r.Recheck = stackOf(n, ix.stack[n.Name], now)
	r.Maintenance = maintenanceOf(ix.maintenances[n.Name])
	r.Repair = repairOf(ix.repairs[n.Name])
	r.State, r.Problems = stateOf(&r)
	return r
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func quantity(l corev1.ResourceList, name corev1.ResourceName) int64 {
	q, ok := l[name]
	if !ok {
		return 0
	}
	return q.Value()
}

// stackOf is where each GPU-stack component is on the node: the deploy
// labels gpustack sets, and the readiness of the component's pod on the
// node. Every component starts at once and waits in its init containers
// for the ones it needs (Component.After): a pod is Stuck only once what
// it waits for is Ready, else it is Pending behind it. Nil when the node
// has no GPU stack. recheck is when a Pending pod of the stack, still not
// Ready, will count as Stuck (zero: none).
func stackOf(n *corev1.Node, pods map[string]stackPod, now time.Time) (out []Component, recheck time.Time) {
	deployed := false
	deployLabel := map[string]string{}
	for _, c := range nvidiav1.Components {
		deployLabel[c.Key] = c.DeployLabel
	}
	waiting := func(c nvidiav1.Component) bool {
		for _, dep := range c.After {
			if n.Labels[deployLabel[dep]] != "true" {
				continue // not deployed here (off, or provided by the host)
			}
			if p, ok := pods[dep]; !ok || !p.ready {
				return true
			}
		}
		return false
	}
	for _, c := range nvidiav1.Components {
		v, has := n.Labels[c.DeployLabel]
		st := ComponentAbsent
		switch {
		case has && v != "true":
			st = ComponentOff
		case has:
			deployed = true
			p, ok := pods[c.Key]
			switch {
			case ok && p.ready:
				st = ComponentReady
			case ok && now.Sub(p.since) > StackStuckAfter && !waiting(c):
				st = ComponentStuck
			default:
				st = ComponentPending
				if at := p.since.Add(StackStuckAfter); ok && (recheck.IsZero() || at.Before(recheck)) && at.After(now) {
					recheck = at
				}
			}
		}
		if c.Key == nvidiav1.Driver && n.Labels[nvidiav1.LabelUpgradeState] == "failed" {
			st = ComponentFailed
		}
		if st == ComponentAbsent && c.OffByDefault {
			continue
		}
		out = append(out, Component{Name: stackNames[c.Key], Status: st})
	}
	if !deployed {
		return nil, time.Time{}
	}
	return out, recheck
}

// phaseRank orders the phases of in-progress objects: the one furthest
// into disrupting the node matters most.
var phaseRank = map[maintenancev1.Phase]int{
	maintenancev1.PhaseDraining: 6, maintenancev1.PhaseWaitForPodCompletion: 5, maintenancev1.PhaseCordon: 4,
	maintenancev1.PhaseRequestorFailed: 3, maintenancev1.PhaseReady: 2, maintenancev1.PhaseScheduled: 1, maintenancev1.PhasePending: 0,
}

func maintenanceOf(nms []*maintenancev1.NodeMaintenance) *Maintenance {
	if len(nms) == 0 {
		return nil
	}
	best := nms[0]
	for _, nm := range nms[1:] {
		rb, rn := phaseRank[best.Phase()], phaseRank[nm.Phase()]
		if rn > rb || rn == rb && nm.CreationTimestamp.Before(&best.CreationTimestamp) {
			best = nm
		}
	}
	m := &Maintenance{
		Namespace: best.Namespace, Name: best.Name, Requestor: best.Spec.RequestorID, Phase: best.Phase(),
		DrainBlocked: drainHeld(best), Deleting: best.DeletionTimestamp != nil, Others: len(nms) - 1,
	}
	if m.Phase == maintenancev1.PhasePending {
		if c := meta.FindStatusCondition(best.Status.Conditions, maintenancev1.ConditionTypeReady); c != nil {
			m.Waiting = c.Message
		}
	}
	if best.Status.Drain != nil && m.Phase == maintenancev1.PhaseDraining {
		p := best.Status.Drain.DrainProgress
		m.DrainProgress = &p
	}
	return m
}

// repairOf is the node's open repair: recovery failed before repairing,
// then the newest.
func repairOf(rs []*repairv1.NodeRepair) *Repair {
	var best *repairv1.NodeRepair
	rank := func(r *repairv1.NodeRepair) int {
		switch {
		case r.Recorded():
			return 0
		case r.Status.Phase == repairv1.PhaseRecoveryFailed:
			return 3
		case r.Status.Phase == repairv1.PhaseRepairing || r.Status.Phase == "":
			return 2
		}
		return 0
	}
	for _, r := range rs {
		if rank(r) == 0 {
			continue
		}
		if best == nil || rank(r) > rank(best) || rank(r) == rank(best) && best.CreationTimestamp.Before(&r.CreationTimestamp) {
			best = r
		}
	}
	if best == nil {
		return nil
	}
	phase := best.Status.Phase
	if phase == "" {
		phase = repairv1.PhaseRepairing
	}
	since := best.Spec.Fault.Since
	if since.IsZero() {
		since = best.CreationTimestamp
	}
	return &Repair{Name: best.Name, Phase: phase, Fault: best.Spec.Fault.Rule, Since: since, Message: best.Status.Message}
}

// stateOf is the row's overall state (the first that applies, in the
// order of States) and, in words, what keeps it from work.
func stateOf(r *Row) (State, []string) {
	var problems []string
	if r.Repair != nil {
		problems = append(problems, fmt.Sprintf("repair %s: %s", r.Repair.Phase, r.Repair.Fault))
	}
	if m := r.Maintenance; m != nil && m.Phase != maintenancev1.PhasePending {
		problems = append(problems, fmt.Sprintf("maintenance by %s: %s", m.Requestor, m.Phase))
	}
	if !r.Ready {
		problems = append(problems, "node not Ready")
	}
	var degraded []string
	for _, c := range r.Stack {
		if c.Status == ComponentStuck || c.Status == ComponentFailed {
			degraded = append(degraded, c.Name+" "+string(c.Status))
		}
	}
	if len(degraded) > 0 {
		problems = append(problems, "GPU stack: "+strings.Join(degraded, ", "))
	}
	if r.GPUs.Faulty != nil && *r.GPUs.Faulty > 0 {
		problems = append(problems, fmt.Sprintf("%d faulty GPU(s)", *r.GPUs.Faulty))
	}
	if r.Unschedulable {
		problems = append(problems, "cordoned")
	}
	m := r.Maintenance
	switch {
	case r.Repair != nil && r.Repair.Phase == repairv1.PhaseRecoveryFailed:
		return StateRecoveryFailed, problems
	case r.Repair != nil:
		return StateRepairing, problems
	case m != nil && (m.Phase == maintenancev1.PhaseCordon || m.Phase == maintenancev1.PhaseWaitForPodCompletion || m.Phase == maintenancev1.PhaseDraining):
		return StateDraining, problems
	case m != nil && m.Phase != maintenancev1.PhasePending:
		return StateInMaintenance, problems
	case !r.Ready:
		return StateNotReady, problems
	case len(degraded) > 0:
		return StateDegradedStack, problems
	case r.Unschedulable:
		return StateCordoned, problems
	}
	return StateReady, problems
}

// age renders how long ago t was, like kubectl (5s, 3m, 2h, 4d).
func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t.Time)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func drainHeld(nm *maintenancev1.NodeMaintenance) bool {
	held, _ := nm.DrainHeld()
	return held
}
