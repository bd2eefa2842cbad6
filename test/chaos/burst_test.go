package chaos

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
	"github.com/gpufleet/gpufleet/internal/repair"
)

var (
	burstNodes            = flag.Int("burst.nodes", 1500, "simulated GPU nodes, 8 GPUs each (BenchmarkGPUFaultBurst)")
	burstFaults           = flag.Int("burst.faults", 200, "GPU faults injected at once, on distinct GPUs (a tenth of the faulty nodes get two)")
	burstPools            = flag.Int("burst.pools", 30, "node pools (label gpufleet.dev/pool) the nodes are spread over")
	burstPodsPerNode      = flag.Int("burst.pods-per-node", 1, "pods with a GPU claim per node (a node with two faults gets at least two)")
	burstMaxParallelPools = flag.Int("burst.max-parallel-pools", 10, "NodeRepairPolicy maxParallelPools")
	burstMaxParallel      = flag.Int("burst.max-parallel", 6, "MaintenanceOperatorConfig maxParallelOperations")
	burstMaxUnavailable   = flag.Int("burst.max-unavailable", 7, "MaintenanceOperatorConfig maxUnavailable (one node is cordoned by an admin)")
	burstAgentWorkers     = flag.Int("burst.agent-workers", 0, "workers of the in-process simulated agents (0: agent.InProcess's, 4, as gpufleet dev); a real fleet runs one agent per node")
	burstXID              = flag.Int("burst.xid", 48, "XID injected (a ResetGPU-class code: 48 or 95)")
	burstUntil            = flag.String("burst.until", "service", "what the burst waits for: service (every GPU back in service, every repair ended) or isolated (every faulty GPU isolated, then -burst.observe more of repairs under the limits; for fleets where repairing every node would take hours)")
	burstObserve          = flag.Duration("burst.observe", 2*time.Minute, "with -burst.until=isolated: how long repairs run under the watch of the limit checks after the last isolation")
	burstBound            = flag.Duration("burst.timeout", 25*time.Minute, "longest wait for every GPU to be back in service")
	burstCPUProfile       = flag.String("burst.cpu-profile", "", "write the operator's CPU profile of the burst's first 60 s to this file")
	burstOperatorLog      = flag.String("burst.operator-log", "", "copy the operator's log to this file at the end (default: not kept)")
	burstReport           = flag.String("burst.report", "", "directory for burst-<nodes>.json and .md (default: results/ in the source tree)")
)

// burstLabel marks the benchmark's claim pods.
const burstLabel = "burst.gpufleet.dev/pod"

// gpuFault is one injected fault and what the watches saw of it (times as
// observed by this process's informers).
type gpuFault struct {
	node, pool       string
	gpu              int
	pci, gfName, dtr string
	pods             []string // namespace/name of the pods whose claim holds the GPU
	injectStart      time.Time
	injected         time.Time // InjectXID returned: the fault is on the node
	detected         time.Time // GPUFault status.class set
	isolated         time.Time // DeviceTaintRule created
	repair           string    // the NodeRepair whose spec.gpus has it
	gfClear          time.Time // GPUFault class empty again
	dtrGone          time.Time // DeviceTaintRule deleted
	// notes: each isolation note the isolator wrote on the GPUFault, with
	// the time from the injection (why a GPU is not isolated yet).
	notes    []string
	lastNote string
}

// repairSeen is one NodeRepair as the watches saw it.
type repairSeen struct {
	node, pool     string
	gpus           []string // PCI bus IDs
	since          time.Time
	created        time.Time
	resetPending   time.Time
	resetDone      time.Time
	resetOutcome   string // the ResetGPU outcome and its message
	rebooted       bool   // a Reboot step in its timeline
	validatePend   time.Time
	validateDone   time.Time
	ended          time.Time
	phase          repairv1.Phase
	message        string
	gpuMaintenance string
	// rule and fault: what the detector saw (spec.fault).
	rule, fault string
}

// nmSeen is one NodeMaintenance of a repair.
type nmSeen struct {
	created, scheduled, ready, gone time.Time
}

// burstWatch records, from informers, every fault's progress and checks
// the repair limits on every NodeRepair event.
type burstWatch struct {
	maxPools int

	mu        sync.Mutex
	faults    []*gpuFault
	byGF      map[string][]*gpuFault // GPUFault name
	byNodePCI map[string]*gpuFault   // node/pci
	repairs   map[string]*repairSeen
	nms       map[string]*nmSeen
	podEvict  map[string]time.Time
	podGone   map[string]time.Time
	// A node's simulated GPU plugin pod taken down (evicted, deleted) and
	// not yet replaced, and how long each replacement took to be bound to
	// its node (what the simulated plugin counts as its restart).
	pluginDown     map[string]pluginDown
	pluginRestarts []time.Duration
	pluginRestart  map[string]time.Duration // node -> its last one
	pluginUp       map[string]time.Time     // node -> its last replacement bound
	// simPlugin: the simulated GPU plugins' last pass over a node (nil:
	// not known).
	simPlugin func(node string) (devcluster.SimPluginSync, bool)
	ends      []time.Time       // NodeRepairs seen ending
	active    map[string]string // active NodeRepair -> pool
	ignored   int
	// Repair limits seen.
	maxPerPool, maxPoolsSeen, events int
	problems                         []string
}

func newBurstWatch(faults []*gpuFault, maxPools int) *burstWatch {
	w := &burstWatch{maxPools: maxPools, faults: faults, byGF: map[string][]*gpuFault{}, byNodePCI: map[string]*gpuFault{},
		repairs: map[string]*repairSeen{}, nms: map[string]*nmSeen{}, podEvict: map[string]time.Time{}, podGone: map[string]time.Time{},
		pluginDown: map[string]pluginDown{}, pluginRestart: map[string]time.Duration{}, pluginUp: map[string]time.Time{},
		active: map[string]string{}}
	for _, f := range faults {
		w.byGF[f.gfName] = append(w.byGF[f.gfName], f)
		w.byNodePCI[f.node+"/"+f.pci] = f
	}
	return w
}

func deleted[T any](o any) (T, bool) {
	if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = tomb.Obj
	}
	t, ok := o.(T)
	return t, ok
}

func (w *burstWatch) onGPUFault(gf *repairv1.GPUFault) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range w.byGF[gf.Name] {
		switch {
		case f.detected.IsZero() && !gf.InService():
			f.detected = now
		case !f.detected.IsZero() && f.gfClear.IsZero() && gf.InService():
			f.gfClear = now
		}
		if note := gf.Annotations[repair.AnnotationIsolation]; note != f.lastNote {
			f.lastNote = note
			f.notes = append(f.notes, fmt.Sprintf("+%.1f s %q", now.Sub(f.injected).Seconds(), note))
		}
	}
}

func (w *burstWatch) onRule(r *resourcev1.DeviceTaintRule, gone bool) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range w.byGF[r.Labels[repair.LabelIsolates]] {
		switch {
		case !gone && f.isolated.IsZero():
			f.isolated = now
		case gone && !f.isolated.IsZero() && f.dtrGone.IsZero():
			f.dtrGone = now
		}
	}
}

func (w *burstWatch) onRepair(nr *repairv1.NodeRepair) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events++
	if nr.Recorded() {
		if _, ok := w.repairs[nr.Name]; !ok {
			w.ignored++
			w.repairs[nr.Name] = &repairSeen{node: nr.Spec.NodeName, pool: nr.Spec.Pool, created: now, phase: repairv1.PhaseIgnored, ended: now}
		}
		return
	}
	r := w.repairs[nr.Name]
	if r == nil {
		r = &repairSeen{node: nr.Spec.NodeName, pool: nr.Spec.Pool, created: now, since: nr.Spec.Fault.Since.Time,
			rule: nr.Spec.Fault.Rule, fault: nr.Spec.Fault.Reason + ": " + nr.Spec.Fault.Message}
		for _, g := range nr.Spec.GPUs {
			r.gpus = append(r.gpus, g.PCIBusID)
			if f := w.byNodePCI[nr.Spec.NodeName+"/"+g.PCIBusID]; f != nil && f.repair == "" {
				f.repair = nr.Name
			}
		}
		w.repairs[nr.Name] = r
	}
	if p := nr.Status.Pending; p != nil {
		switch {
		case p.Action == repairv1.ActionResetGPU && r.resetPending.IsZero():
			r.resetPending = now
		case p.Action == repairv1.ActionValidateGPU && r.validatePend.IsZero():
			r.validatePend = now
		}
	}
	for _, e := range nr.Status.Timeline {
		switch {
		case e.Step == string(repairv1.ActionResetGPU) && e.Outcome != repairv1.OutcomeRequested && e.Outcome != repairv1.OutcomeStarted && r.resetDone.IsZero():
			r.resetDone = now
			r.resetOutcome = strings.TrimSuffix(e.Outcome+": "+e.Message, ": ")
		case e.Step == string(repairv1.ActionValidateGPU) && e.Outcome != repairv1.OutcomeRequested && e.Outcome != repairv1.OutcomeStarted && r.validateDone.IsZero():
			r.validateDone = now
		}
		if e.Step == string(repairv1.ActionReboot) {
			r.rebooted = true
		}
	}
	if nr.Status.GPUMaintenanceName != "" {
		r.gpuMaintenance = nr.Status.GPUMaintenanceName
	}
	done := nr.Status.Phase != "" && nr.Status.Phase != repairv1.PhaseRepairing
	if done && r.ended.IsZero() {
		r.ended, r.phase, r.message = now, nr.Status.Phase, nr.Status.Message
		w.ends = append(w.ends, now)
	}
	if done || nr.DeletionTimestamp != nil {
		delete(w.active, nr.Name)
	} else {
		w.active[nr.Name] = nr.Spec.Pool
	}
	w.checkLimits(now)
}

func (w *burstWatch) onRepairGone(nr *repairv1.NodeRepair) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.active, nr.Name)
}

// checkLimits: at most one repair per pool, at most maxParallelPools pools
// repairing (repair.Admit); the caller holds mu.
func (w *burstWatch) checkLimits(now time.Time) {
	perPool := map[string]int{}
	for _, pool := range w.active {
		perPool[pool]++
	}
	for pool, n := range perPool {
		w.maxPerPool = max(w.maxPerPool, n)
		if n > 1 {
			w.problems = append(w.problems, fmt.Sprintf("%s: %d repairs in progress in pool %s (at most one per pool)", now.Format(time.RFC3339Nano), n, pool))
		}
	}
	w.maxPoolsSeen = max(w.maxPoolsSeen, len(perPool))
	if len(perPool) > w.maxPools {
		w.problems = append(w.problems, fmt.Sprintf("%s: %d pools repairing (maxParallelPools %d)", now.Format(time.RFC3339Nano), len(perPool), w.maxPools))
	}
}

func (w *burstWatch) onNM(nm *maintenancev1.NodeMaintenance, gone bool) {
	if nm.Spec.RequestorID != repair.Requestor {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.nms[nm.Name]
	if s == nil {
		s = &nmSeen{created: now}
		w.nms[nm.Name] = s
	}
	if gone {
		if s.gone.IsZero() {
			s.gone = now
		}
		return
	}
	for _, c := range nm.Status.Conditions {
		if c.Type != "Ready" {
			continue
		}
		if c.Reason != "" && c.Reason != "Pending" && s.scheduled.IsZero() {
			s.scheduled = now
		}
		if c.Status == metav1.ConditionTrue && s.ready.IsZero() {
			s.ready = now
		}
	}
}

// pluginDown is a node's simulated GPU plugin pod taken down.
type pluginDown struct {
	uid types.UID
	at  time.Time
}

// onPluginPod times a node's GPU plugin restart: from its pod's eviction
// or deletion to a new pod bound to the node.
func (w *burstWatch) onPluginPod(p *corev1.Pod, gone bool) {
	node := p.Spec.NodeName
	if node == "" {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	down, isDown := w.pluginDown[node]
	switch {
	case (gone || p.DeletionTimestamp != nil) && !isDown:
		w.pluginDown[node] = pluginDown{uid: p.UID, at: now}
	case !gone && p.DeletionTimestamp == nil && isDown && p.UID != down.uid:
		d := now.Sub(down.at)
		w.pluginRestarts = append(w.pluginRestarts, d)
		w.pluginRestart[node] = d
		w.pluginUp[node] = now
		delete(w.pluginDown, node)
	}
}

func (w *burstWatch) onPod(p *corev1.Pod, gone bool) {
	if devcluster.IsSimPluginPod(p) {
		w.onPluginPod(p, gone)
		return
	}
	if p.Labels[burstLabel] == "" {
		return
	}
	now := time.Now()
	key := p.Namespace + "/" + p.Name
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.DeletionTimestamp != nil {
		if _, ok := w.podEvict[key]; !ok {
			w.podEvict[key] = now
		}
	}
	if gone {
		if _, ok := w.podGone[key]; !ok {
			w.podGone[key] = now
		}
		if _, ok := w.podEvict[key]; !ok {
			w.podEvict[key] = now
		}
	}
}

// backInService: every fault's GPU has an empty class and no rule, every
// repair ended and its NodeMaintenance is gone.
// isolatedCount is the number of faults whose DeviceTaintRule was seen.
func (w *burstWatch) isolatedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, f := range w.faults {
		if !f.isolated.IsZero() {
			n++
		}
	}
	return n
}

func (w *burstWatch) backInService() (done, total int, repairsOpen int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range w.faults {
		if !f.gfClear.IsZero() && (f.isolated.IsZero() || !f.dtrGone.IsZero()) {
			done++
		}
	}
	repairsOpen = len(w.active)
	for _, s := range w.nms {
		if s.gone.IsZero() {
			repairsOpen++
		}
	}
	return done, len(w.faults), repairsOpen
}

// watch starts informers of GPUFaults, DeviceTaintRules, NodeRepairs,
// NodeMaintenances and the claim pods, and waits for their caches.
func (w *burstWatch) watch(ctx context.Context, b *testing.B, env *devcluster.Env) {
	scheme, _ := operator.Scheme()
	c, err := crcache.New(env.Config, crcache.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}
	add := func(obj client.Object, h toolscache.ResourceEventHandlerFuncs) {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			b.Fatal(err)
		}
	}
	add(&repairv1.GPUFault{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onGPUFault(o.(*repairv1.GPUFault)) },
		UpdateFunc: func(_, o any) { w.onGPUFault(o.(*repairv1.GPUFault)) },
	})
	add(&resourcev1.DeviceTaintRule{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { w.onRule(o.(*resourcev1.DeviceTaintRule), false) },
		DeleteFunc: func(o any) {
			if r, ok := deleted[*resourcev1.DeviceTaintRule](o); ok {
				w.onRule(r, true)
			}
		},
	})
	add(&repairv1.NodeRepair{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onRepair(o.(*repairv1.NodeRepair)) },
		UpdateFunc: func(_, o any) { w.onRepair(o.(*repairv1.NodeRepair)) },
		DeleteFunc: func(o any) {
			if r, ok := deleted[*repairv1.NodeRepair](o); ok {
				w.onRepairGone(r)
			}
		},
	})
	add(&maintenancev1.NodeMaintenance{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onNM(o.(*maintenancev1.NodeMaintenance), false) },
		UpdateFunc: func(_, o any) { w.onNM(o.(*maintenancev1.NodeMaintenance), false) },
		DeleteFunc: func(o any) {
			if nm, ok := deleted[*maintenancev1.NodeMaintenance](o); ok {
				w.onNM(nm, true)
			}
		},
	})
	add(&corev1.Pod{}, toolscache.ResourceEventHandlerFuncs{
		// (A plugin pod's replacement arrives as an add, bound later.)
		AddFunc: func(o any) {
			if p := o.(*corev1.Pod); devcluster.IsSimPluginPod(p) {
				w.onPod(p, false)
			}
		},
		UpdateFunc: func(_, o any) { w.onPod(o.(*corev1.Pod), false) },
		DeleteFunc: func(o any) {
			if p, ok := deleted[*corev1.Pod](o); ok {
				w.onPod(p, true)
			}
		},
	})
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		b.Fatal("the benchmark's watch caches did not sync")
	}
}

// burstReportData is what BenchmarkGPUFaultBurst writes.
type burstReportData struct {
	Commit     string         `json:"commit"`
	Date       string         `json:"date"`
	Command    string         `json:"command"`
	Parameters map[string]any `json:"parameters"`
	// SetupSeconds: cluster, nodes and claim pods running.
	SetupSeconds float64 `json:"setupSeconds"`
	// InjectionSpreadMs: first InjectXID call to the last one returned.
	InjectionSpreadMs float64 `json:"injectionSpreadMs"`
	// BurstSeconds: first injection to the last GPU back in service.
	BurstSeconds float64 `json:"burstSeconds"`
	Faults       int     `json:"faults"`
	FaultyNodes  int     `json:"faultyNodes"`
	// FailedRepairs: each repair that ended RecoveryFailed, with its
	// node and status message.
	FailedRepairs []string `json:"failedRepairs,omitempty"`
	// SlowestIsolations: the three faults isolated last after their
	// detection, with the isolation notes written on their GPUFault.
	SlowestIsolations []string `json:"slowestIsolations,omitempty"`
	// ResetOutcomes counts the repairs' ResetGPU outcomes (with the
	// message when not Succeeded); Rebooted counts the repairs that went
	// up the ladder to a reboot.
	ResetOutcomes  map[string]int `json:"resetOutcomes,omitempty"`
	Rebooted       int            `json:"rebooted"`
	Repairs        int            `json:"repairs"`
	RepairsByPhase map[string]int `json:"repairsByPhase"`
	IgnoredRecords int            `json:"ignoredRecords"`
	// ExtraRepairs: repairs of a faulty node after its first (e.g. a
	// fault its first repair left); examples say which.
	ExtraRepairs        int      `json:"extraRepairs"`
	ExtraRepairExamples []string `json:"extraRepairExamples,omitempty"`
	// OpenAtEnd: the repairs and NodeMaintenance objects still open when
	// the benchmark stopped watching, where each stood (with the pods of
	// a drain's node that are being deleted), to tell a stuck step from
	// one the window cut short.
	OpenAtEnd []string `json:"openAtEnd,omitempty"`
	// FromFaultMs: per fault, from its injection to each milestone.
	FromFaultMs map[string]map[string]float64 `json:"fromFaultMs"`
	// StagesMs: per repair (or fault), each stage between milestones,
	// labelled wait (limits, policy) or work (gpufleet, simulation).
	StagesMs map[string]map[string]float64 `json:"stagesMs"`
	// DispatchAllowed: repairs whose limits allowed them at their
	// threshold; DispatchWithin5s of them had their GPU drain requested
	// within 5 s of the threshold. DispatchFromAllowedMs: every repair,
	// from when the limits allowed it (the later of its threshold and the
	// last repair that ended before it was created) to its drain request.
	DispatchAllowed       int                `json:"dispatchAllowedAtThreshold"`
	DispatchWithin5s      int                `json:"dispatchWithin5sOfThreshold"`
	DispatchFromAllowedMs map[string]float64 `json:"dispatchFromAllowedMs"`
	// Controllers: per operator controller during the burst, its
	// reconciles by result, retries after an error and how long a key
	// waited in its queue (p50 / p99, from the operator's metrics).
	Controllers []string `json:"controllers,omitempty"`
	// SimPluginQueueMs: how long a node waited in the simulated GPU
	// plugins' queue before their pass over it, during the burst.
	SimPluginQueueMs map[string]float64 `json:"simPluginQueueMs,omitempty"`
	// PluginRestartMs: each simulated GPU plugin pod taken down (gpufleet
	// restarts them when a repaired GPU stays out) to its replacement
	// bound to the node; PluginsDownAtEnd: those not replaced by the end.
	PluginRestartMs  map[string]float64 `json:"pluginRestartMs"`
	PluginRestarts   int                `json:"pluginRestarts"`
	PluginsDownAtEnd int                `json:"pluginsDownAtEnd"`
	// Evictions of claim pods (deletionTimestamp seen).
	Evictions           int     `json:"evictions"`
	EvictionsPerSecond  float64 `json:"evictionsPerSecond"`
	PeakEvictionsPerSec int     `json:"peakEvictionsInOneSecond"`
	// NM scheduling latency from a free slot (the chaos checker's measure).
	NMSchedulingLatencyMs  map[string]float64 `json:"maintenanceSchedulingLatencyMs"`
	OperatorRequests       map[string]int     `json:"operatorRequests"`
	RequestsPerRepair      float64            `json:"operatorRequestsPerRepair"`
	AgentRequests          map[string]int     `json:"agentRequests"`
	AgentRequestsPerRepair float64            `json:"agentRequestsPerRepair"`
	CPUSeconds             float64            `json:"operatorCPUSecondsDuringBurst"`
	CPUSecondsTotal        float64            `json:"operatorCPUSecondsTotal"`
	PeakRSSMB              float64            `json:"operatorPeakRSSMB"`
	// BenchCPUSeconds: this process during the burst (the simulated
	// agents, the checker, the watches); MachineCPUBusy: the share of the
	// machine's CPU time not idle during the burst (/proc/stat).
	BenchCPUSeconds float64 `json:"benchmarkProcessCPUSecondsDuringBurst"`
	MachineCPUBusy  float64 `json:"machineCPUBusyDuringBurst"`
	// LoadAverage: /proc/loadavg before and after the burst (other work
	// on the machine shows here).
	LoadAverage [2]string `json:"loadAverageBeforeAfter"`
	RSSMB       float64   `json:"operatorRSSMBAtEnd"`
	// Limits seen: NodeMaintenance (the chaos checker) and repairs.
	MaxInProgress       int               `json:"maxMaintenanceInProgress"`
	MaxHeld             int               `json:"maxHeldOrCordoned"`
	MaxRepairsPerPool   int               `json:"maxRepairsPerPool"`
	MaxPoolsRepairing   int               `json:"maxPoolsRepairing"`
	CheckedEvents       int               `json:"checkedEvents"`
	Violations          []string          `json:"violations"`
	SimulatedResetNote  string            `json:"simulatedReset"`
	SimulatedValidation string            `json:"simulatedValidation"`
	NVSentinel          map[string]string `json:"nvsentinelPublished"`
}

// BenchmarkGPUFaultBurst: N kwok GPU nodes (8 GPUs each, published in DRA
// ResourceSlices) over P pools, a pod with a GPU claim on each node (two on
// a node that gets two faults), the real operator binary (maintenance and
// repair) as its own process, the simulated node agents of every node in
// this process (agent.InProcess with devcluster.SimExecutor, as `gpufleet
// dev` runs them), a NodeRepairPolicy with a gpu section and the default
// rules (gpu-reset: threshold 10 s, ResetGPU then Reboot), maxParallelPools
// and a MaintenanceOperatorConfig whose limits bind. F XIDs are injected
// at once on distinct GPUs that hold a claim. Informers time every fault
// to detection, isolation, repair, drain request, drain, reset and back in
// service; the chaos checker watches the NodeMaintenance limits and this
// benchmark the repair limits (one repair per pool, maxParallelPools). It
// writes results/burst-<nodes>.json and .md.
func BenchmarkGPUFaultBurst(b *testing.B) {
	ctx := context.Background()
	nodes, pools, nFaults := *burstNodes, *burstPools, *burstFaults
	plan, err := burstPlan(nodes, pools, nFaults)
	if err != nil {
		b.Fatal(err)
	}
	threshold := time.Duration(0)
	for _, r := range repair.DefaultRules() {
		if r.Name == "gpu-reset" {
			threshold = time.Duration(r.ThresholdSeconds) * time.Second
		}
	}
	bin := buildOperator(b)
	setupBegan := time.Now()
	var env *devcluster.Env
	var kubeconfig string
	if nodes > 3000 {
		env, kubeconfig, _, _ = startLargeEnv(b, nodes, pools) // nodes created in parallel, leases scaled
	} else {
		env, kubeconfig = startEnv(b, largeCluster, nodes, pools)
	}
	const adminCordoned = "gpu-000"
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, adminCordoned, "application/merge-patch+json",
		[]byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d nodes Ready after %s", nodes, time.Since(setupBegan).Round(time.Second))
	faults, claimPods := burstPods(b, env, plan, nodes)
	setup := time.Since(setupBegan)
	b.Logf("%d claim pods running after %s", claimPods, setup.Round(time.Second))

	addr, err := freeAddr()
	if err != nil {
		b.Fatal(err)
	}
	op := &operatorProcess{bin: bin, kubeconfig: kubeconfig, dir: b.TempDir(), metricsAddr: addr}
	op.startWith(b, "maintenance,repair")
	defer op.kill()
	// The simulated node agents of every node, in this process.
	agentCtx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	agentCfg, agentRequests := devcluster.CountRequests(env.OperatorConfig)
	sim := devcluster.SimExecutor{Cluster: env.Cluster}
	daemon, err := agent.InProcess(agentCfg, sim, nil)
	agentWorkers := "4 (agent.InProcess)"
	if *burstAgentWorkers > 0 {
		daemon, err = agent.New(agentCfg, agent.Options{Executor: sim, GPUs: sim, Workers: *burstAgentWorkers})
		agentWorkers = strconv.Itoa(*burstAgentWorkers)
	}
	if err != nil {
		b.Fatal(err)
	}
	agentDone := make(chan struct{})
	go func() {
		defer close(agentDone)
		if err := daemon.Start(agentCtx); err != nil {
			b.Errorf("agent: %v", err)
		}
	}()
	defer func() { stopAgent(); <-agentDone }()

	mpo, mu := intstr.FromInt(*burstMaxParallel), intstr.FromInt(*burstMaxUnavailable)
	if err := env.Kube.Create(ctx, &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: &mpo, MaxUnavailable: &mu},
	}); err != nil {
		b.Fatal(err)
	}
	policy := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "burst"}, Spec: repairv1.NodeRepairPolicySpec{
		AllowReboot: true, MaxParallelPools: ptr.To(int32(*burstMaxParallelPools)), VerificationSeconds: ptr.To[int32](10),
		// The claim pods are bare pods (no controller): force.
		Drain: repairv1.DrainSpec{Force: ptr.To(true)},
		GPU: repairv1.GPUSpec{DRADriver: devcluster.DRADriver,
			ReplaceAfter: &repairv1.RepeatLimit{Count: 3, WindowSeconds: 86400},
			Validation:   &repairv1.GPUValidation{Level: repairv1.GPUValidationHealth, TimeoutSeconds: 300}},
	}}
	if err := env.Kube.Create(ctx, policy); err != nil {
		b.Fatal(err)
	}
	chk := newChecker(env.Cluster, env.Kube, adminCordoned, *burstMaxParallel, *burstMaxUnavailable)
	checkCtx, stopChecker := context.WithCancel(ctx)
	defer stopChecker()
	go chk.run(checkCtx)
	w := newBurstWatch(faults, *burstMaxParallelPools)
	w.simPlugin = env.SimPluginLastSync
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w.watch(watchCtx, b, env)
	waitOperatorSettled(b, op)
	famsBefore, err := scrape(addr)
	if err != nil {
		b.Fatal(err)
	}
	before := apiRequests(famsBefore)
	simPassesBefore := env.SimPluginPasses()
	agentBefore := agentRequests.Snapshot()
	cpuBefore := cpuSecondsOf(op.pid())
	selfBefore := cpuSecondsOf(os.Getpid())
	busyBefore, allBefore := machineCPU()
	loadBefore := loadAverage()

	// The burst: every fault at once.
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, f := range faults {
		wg.Go(func() {
			<-start
			f.injectStart = time.Now()
			if err := env.InjectXID(ctx, f.node, f.gpu, *burstXID); err != nil {
				b.Errorf("injecting XID %d on %s GPU %d: %v", *burstXID, f.node, f.gpu, err)
			}
			f.injected = time.Now()
		})
	}
	profiled := make(chan error, 1)
	if *burstCPUProfile != "" {
		go func() { profiled <- savePprof(addr, "profile?seconds=60", *burstCPUProfile) }()
	} else {
		profiled <- nil
	}
	began := time.Now()
	close(start)
	wg.Wait()
	b.Logf("%d XIDs injected in %s", len(faults), time.Since(began).Round(time.Millisecond))
	lastLog := time.Now()
	untilIsolated := *burstUntil == "isolated"
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, *burstBound, false, func(context.Context) (bool, error) {
		done, total, open := w.backInService()
		isolated := w.isolatedCount()
		if time.Since(lastLog) > 30*time.Second {
			lastLog = time.Now()
			b.Logf("%s: %d/%d GPUs isolated, %d back in service, %d repairs or maintenances open", time.Since(began).Round(time.Second), isolated, total, done, open)
		}
		if untilIsolated {
			return isolated == total, nil
		}
		return done == total && open == 0, nil
	})
	if err == nil && untilIsolated {
		b.Logf("every GPU isolated after %s; repairs go on under the limit checks for %s", time.Since(began).Round(time.Millisecond), *burstObserve)
		time.Sleep(*burstObserve)
	}
	burst := time.Since(began)
	if err != nil {
		done, total, open := w.backInService()
		b.Errorf("not every GPU %s within %s: %d/%d isolated, %d/%d back in service, %d repairs or maintenances open",
			map[bool]string{true: "isolated", false: "back in service"}[untilIsolated], *burstBound, w.isolatedCount(), total, done, total, open)
	}
	cpu := cpuSecondsOf(op.pid()) - cpuBefore
	selfCPU := cpuSecondsOf(os.Getpid()) - selfBefore
	busyAfter, allAfter := machineCPU()
	loadAfter := loadAverage()
	famsAfter, err := scrape(addr)
	if err != nil {
		b.Fatal(err)
	}
	after := apiRequests(famsAfter)
	simWaits := env.SimPluginWaitsSince(simPassesBefore)
	agentUsed := agentRequests.Since(agentBefore)
	rss, hwm := memoryOf(op.pid())
	cpuTotal := cpuSecondsOf(op.pid())
	stopChecker()
	stopWatch()
	chk.final(ctx, b, 0)
	openWork := openRepairWork(ctx, env)
	if err := <-profiled; err != nil {
		b.Errorf("operator CPU profile: %v", err)
	}

	rep := w.report(threshold)
	rep.Commit, rep.Date = gitCommit(), time.Now().UTC().Format(time.RFC3339)
	rep.Command = fmt.Sprintf("flock /tmp/cluster-test.lock env GPUFLEET_BIN_DIR=$PWD/bin go test -count=1 -run '^$' -bench BenchmarkGPUFaultBurst -benchtime 1x -timeout 60m ./test/chaos/ -args -burst.nodes=%d -burst.faults=%d -burst.pools=%d -burst.pods-per-node=%d -burst.until=%s",
		nodes, nFaults, pools, *burstPodsPerNode, *burstUntil)
	if *burstAgentWorkers > 0 {
		rep.Command += fmt.Sprintf(" -burst.agent-workers=%d", *burstAgentWorkers)
	}
	if *burstUntil == "isolated" {
		rep.Command += fmt.Sprintf(" -burst.observe=%s", *burstObserve)
	}
	rep.Parameters = map[string]any{"nodes": nodes, "gpusPerNode": 8, "pools": pools, "faults": nFaults, "xid": *burstXID,
		"claimPods": claimPods, "podsPerNode": *burstPodsPerNode, "podTerminationSeconds": 1,
		"maxParallelPools": *burstMaxParallelPools, "maxParallelOperations": *burstMaxParallel, "maxUnavailable": *burstMaxUnavailable,
		"until": *burstUntil, "adminCordonedNodes": 1, "gpuResetThresholdSeconds": threshold.Seconds(), "validation": "Health, 300 s",
		"operator": "the real binary, own process, capabilities maintenance,repair",
		"agents":   "the simulated agents of every node in the benchmark's process (devcluster.SimExecutor), workers " + agentWorkers}
	rep.SetupSeconds = setup.Seconds()
	rep.BurstSeconds = burst.Seconds()
	rep.OperatorRequests = diffCounts(before, after)
	rep.AgentRequests = agentUsed
	if rep.Repairs > 0 {
		rep.RequestsPerRepair = float64(sum(rep.OperatorRequests)) / float64(rep.Repairs)
		rep.AgentRequestsPerRepair = float64(sum(agentUsed)) / float64(rep.Repairs)
	}
	rep.Controllers = controllerLines(famsBefore, famsAfter)
	rep.SimPluginQueueMs = percentiles(slices.Sorted(slices.Values(simWaits)))
	rep.CPUSeconds, rep.CPUSecondsTotal = cpu, cpuTotal
	rep.BenchCPUSeconds = selfCPU
	rep.LoadAverage = [2]string{loadBefore, loadAfter}
	if allAfter > allBefore {
		rep.MachineCPUBusy = (busyAfter - busyBefore) / (allAfter - allBefore)
	}
	rep.PeakRSSMB, rep.RSSMB = float64(hwm)/1024, float64(rss)/1024
	rep.NMSchedulingLatencyMs = percentiles(chk.latencies())
	rep.MaxInProgress, rep.MaxHeld, rep.CheckedEvents = chk.maxInProgress, chk.maxUnavailable, chk.events+rep.CheckedEvents
	rep.Violations = append(rep.Violations, chk.violations()...)
	rep.OpenAtEnd = openWork
	md := rep.markdown()
	b.Log("\n" + md)
	writeBurstReport(b, rep, md)
	if *burstOperatorLog != "" {
		if data, err := os.ReadFile(op.logPath); err != nil {
			b.Errorf("reading the operator's log: %v", err)
		} else if err := os.WriteFile(*burstOperatorLog, data, 0o644); err != nil {
			b.Errorf("keeping the operator's log: %v", err)
		}
	}
	b.ReportMetric(rep.FromFaultMs["isolated (DeviceTaintRule created)"]["p99"], "ms-p99-isolation")
	b.ReportMetric(rep.FromFaultMs["reset dispatched (ResetGPU pending)"]["p99"], "ms-p99-reset-dispatched")
	b.ReportMetric(rep.FromFaultMs["back in service"]["p99"], "ms-p99-back-in-service")
	b.ReportMetric(rep.EvictionsPerSecond, "evictions/s")
	b.ReportMetric(rep.RequestsPerRepair, "requests/repair")
	b.ReportMetric(cpu, "cpu-s")
	b.ReportMetric(rep.PeakRSSMB, "MB-peak-rss")
	for _, v := range rep.Violations {
		b.Error("invariant: " + v)
	}
	if n := rep.RepairsByPhase[string(repairv1.PhaseRecoveryFailed)]; n > 0 {
		slices.Sort(rep.FailedRepairs)
		for _, f := range rep.FailedRepairs {
			b.Log("failed repair: " + f)
		}
		b.Errorf("%d repairs failed", n)
	}
}

// burstPlan places the faults: distinct nodes, round-robin over the pools
// (never the admin-cordoned gpu-000); the first tenth of the nodes get two
// faults. It returns the number of faults per node index.
func burstPlan(nodes, pools, faults int) (map[int]int, error) {
	doubles := faults / 10
	distinct := faults - doubles
	if pools < 1 || nodes < pools*(2+(distinct-1)/pools) {
		return nil, fmt.Errorf("%d faults on %d distinct nodes over %d pools need at least %d nodes", faults, distinct, pools, pools*(2+(distinct-1)/pools))
	}
	plan := map[int]int{}
	for j := range distinct {
		n := 1
		if j < doubles {
			n = 2
		}
		plan[j%pools+pools*(1+j/pools)] = n
	}
	return plan, nil
}

// burstPods creates the claim pods (podsPerNode on every node but the
// cordoned one, at least the node's faults on a faulty node), waits until
// all run with an allocated claim, and returns the faults: on each faulty
// node, the GPUs the first pods' claims were given.
func burstPods(b *testing.B, env *devcluster.Env, plan map[int]int, nodes int) ([]*gpuFault, int) {
	ctx := context.Background()
	_, err := env.Client.ResourceV1().ResourceClaimTemplates(workloadNamespace).Create(ctx,
		devcluster.GPUClaimTemplate(workloadNamespace, devcluster.GPUClaimTemplateName), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	type podSpec struct{ name, node string }
	var specs []podSpec
	for i := 1; i < nodes; i++ {
		node := fmt.Sprintf("gpu-%03d", i)
		for k := range max(*burstPodsPerNode, plan[i]) {
			specs = append(specs, podSpec{fmt.Sprintf("claim-%s-%d", node, k), node})
		}
	}
	work := make(chan podSpec)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for range 16 {
		wg.Go(func() {
			for s := range work {
				p := devcluster.GPUClaimPod(workloadNamespace, s.name, devcluster.GPUClaimTemplateName, s.node)
				p.Labels = map[string]string{burstLabel: "true"}
				p.Annotations = map[string]string{devcluster.AnnotationTerminateAfter: "1s"}
				if _, err := env.Client.CoreV1().Pods(workloadNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, s := range specs {
		work <- s
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		b.Fatalf("creating %d claim pods: %d failed, first: %v", len(specs), len(errs), errs[0])
	}
	var pods *corev1.PodList
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 20*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err = env.Client.CoreV1().Pods(workloadNamespace).List(ctx, metav1.ListOptions{LabelSelector: burstLabel})
		if err != nil {
			return false, nil //nolint:nilerr // retried
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == len(specs), nil
	})
	if err != nil {
		b.Fatalf("%d claim pods never all running: %v", len(specs), err)
	}
	claims, err := env.Client.ResourceV1().ResourceClaims(workloadNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	device := map[string]string{} // claim -> device
	for _, c := range claims.Items {
		if a := c.Status.Allocation; a != nil && len(a.Devices.Results) > 0 {
			device[c.Name] = a.Devices.Results[0].Device
		}
	}
	onGPU := map[string][]string{} // node/gpu index -> pods
	podsOf := map[string][]string{}
	for _, p := range pods.Items {
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName == nil {
				continue
			}
			d, ok := device[*st.ResourceClaimName]
			if !ok {
				b.Fatalf("claim %s of pod %s not allocated", *st.ResourceClaimName, p.Name)
			}
			key := p.Spec.NodeName + "/" + strings.TrimPrefix(d, "gpu-")
			if len(onGPU[key]) == 0 {
				podsOf[p.Spec.NodeName] = append(podsOf[p.Spec.NodeName], key)
			}
			onGPU[key] = append(onGPU[key], p.Namespace+"/"+p.Name)
		}
	}
	specs2 := devcluster.GPUNodes(nodes, *burstPools)
	var faults []*gpuFault
	for _, i := range slices.Sorted(maps.Keys(plan)) {
		node := fmt.Sprintf("gpu-%03d", i)
		keys := podsOf[node]
		sort.Strings(keys)
		if len(keys) < plan[i] {
			b.Fatalf("node %s: %d GPUs hold a claim, %d faults planned", node, len(keys), plan[i])
		}
		for _, key := range keys[:plan[i]] {
			_, idx, _ := strings.Cut(key, "/")
			gpu, err := strconv.Atoi(idx)
			if err != nil {
				b.Fatalf("device of %s: %v", key, err)
			}
			pci := devcluster.SimGPU(node, gpu).PCIBusID
			gf := agent.GPUFaultName(node, pci)
			faults = append(faults, &gpuFault{node: node, pool: specs2[i].Pool, gpu: gpu, pci: pci,
				gfName: gf, dtr: "gpufleet-" + gf, pods: onGPU[key]})
		}
	}
	return faults, len(specs)
}

type durations map[string][]time.Duration

// add records b-a when both are known.
func (d durations) add(name string, a, b time.Time) {
	if a.IsZero() || b.IsZero() {
		return
	}
	d[name] = append(d[name], b.Sub(a))
}

func (d durations) percentiles() map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for k, v := range d {
		slices.Sort(v)
		out[k] = percentiles(v)
	}
	return out
}

func latest(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}

// Stage names, in the order of a repair (wait: limits or the policy;
// work: gpufleet, the simulated agent or the simulated cluster).
var burstStages = []string{
	"work (agent): injected → GPUFault class set",
	"work (isolator): GPUFault class set → DeviceTaintRule created",
	"wait (policy): GPUFault class set → threshold (fault.since + thresholdSeconds)",
	"wait (repair limits): threshold → allowed",
	"work (detector): allowed → NodeRepair created",
	"work (repairer): NodeRepair created → GPU drain requested (NodeMaintenance created)",
	"wait (maintenance limits): NodeMaintenance created → scheduled",
	"work (maintenance): scheduled → first claim pod evicted",
	"work (cluster): first pod evicted → last pod gone (1 s termination)",
	"work (maintenance): last pod gone → NodeMaintenance Ready",
	"work (repairer): NodeMaintenance Ready → ResetGPU pending",
	"work (agent, simulated reset): ResetGPU pending → its outcome",
	"work (repairer): reset outcome → ValidateGPU pending",
	"work (agent, simulated validation): ValidateGPU pending → its outcome",
	"work (repairer): validation outcome → NodeRepair ended",
	"work (maintenance): NodeRepair ended → NodeMaintenance gone",
	"work (agent, isolator): ValidateGPU pending → GPUFault clear and DeviceTaintRule deleted",
}

var burstMilestones = []string{
	"detected (GPUFault class set)",
	"isolated (DeviceTaintRule created)",
	"repair started (NodeRepair created)",
	"repair dispatched (GPU drain NodeMaintenance created)",
	"drain scheduled (NodeMaintenance in progress)",
	"drained (the GPU's claim pods gone)",
	"reset dispatched (ResetGPU pending)",
	"back in service",
}

// report computes the figures from what the watches saw.
func (w *burstWatch) report(threshold time.Duration) burstReportData {
	w.mu.Lock()
	defer w.mu.Unlock()
	rep := burstReportData{Faults: len(w.faults), RepairsByPhase: map[string]int{}, IgnoredRecords: w.ignored,
		MaxRepairsPerPool: w.maxPerPool, MaxPoolsRepairing: w.maxPoolsSeen, CheckedEvents: w.events,
		Violations: append([]string(nil), w.problems...),
		SimulatedResetNote: "no delay: devcluster.SimExecutor's ResetGPU is one read and one merge patch of the node's annotations (simgpuhost.go resetGPUs); " +
			"the agent then writes the GPUs' records (AwaitValidation)",
		SimulatedValidation: "no delay: the Health validation is one read of the node (simgpuhost.go validateGPUs); the agent records the result on each GPUFault",
		NVSentinel: map[string]string{
			"source":                                 "NVSentinel scale test, burst of 200 health events",
			"fault → quarantined":                    "p50 2.94 s, p99 5.10 s",
			"fault → remediation dispatched":         "p50 21 s, p99 30.5 s",
			"fault → back in service without reboot": "p50 70 s, p99 89 s",
			"drain": "capped at 5 evictions/s",
		}}
	nodes := map[string]bool{}
	first := time.Time{}
	lastInjected := time.Time{}
	for _, f := range w.faults {
		nodes[f.node] = true
		if first.IsZero() || f.injectStart.Before(first) {
			first = f.injectStart
		}
		lastInjected = latest(lastInjected, f.injected)
	}
	rep.FaultyNodes = len(nodes)
	rep.InjectionSpreadMs = float64(lastInjected.Sub(first).Microseconds()) / 1000
	ends := slices.Clone(w.ends)
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	from := durations{}
	stages := durations{}
	var fromAllowed []time.Duration
	for name, r := range w.repairs {
		if r.phase == repairv1.PhaseIgnored {
			continue
		}
		rep.Repairs++
		phase := string(r.phase)
		if phase == "" {
			phase = "not ended"
		}
		rep.RepairsByPhase[phase]++
		if r.resetOutcome != "" {
			if rep.ResetOutcomes == nil {
				rep.ResetOutcomes = map[string]int{}
			}
			rep.ResetOutcomes[r.resetOutcome]++
		}
		if r.rebooted {
			rep.Rebooted++
		}
		if r.phase == repairv1.PhaseRecoveryFailed {
			plugin := "its GPU plugin pod was not restarted"
			if d, ok := w.pluginRestart[r.node]; ok {
				plugin = fmt.Sprintf("its GPU plugin pod's replacement was bound %.1f s after the eviction", d.Seconds())
			} else if down, ok := w.pluginDown[r.node]; ok {
				plugin = fmt.Sprintf("its GPU plugin pod, taken down %s before the end, had no replacement yet", time.Since(down.at).Round(time.Second))
			}
			if up, ok := w.pluginUp[r.node]; ok && w.simPlugin != nil {
				if last, ok := w.simPlugin(r.node); ok {
					plugin += fmt.Sprintf("; the simulated plugins' last pass over the node began %.1f s after that, queued %.1f s, for a plugin started %.1f s after it was bound",
						last.At.Sub(up).Seconds(), last.Waited.Seconds(), last.PluginStart.Sub(up).Seconds())
					if last.Err != "" {
						plugin += ", and failed: " + last.Err
					}
				}
			}
			rep.FailedRepairs = append(rep.FailedRepairs, fmt.Sprintf("%s (node %s, rule %s): %s [%s]", name, r.node, r.rule, r.message, plugin))
		}
		var nm *nmSeen
		if r.gpuMaintenance != "" {
			nm = w.nms[r.gpuMaintenance]
		}
		if nm == nil {
			nm = &nmSeen{}
		}
		// The repair's faults.
		var mine []*gpuFault
		for _, f := range w.faults {
			if f.repair == name {
				mine = append(mine, f)
			}
		}
		if len(mine) == 0 {
			continue
		}
		var detected, lastGone, firstEvict, back time.Time
		for _, f := range mine {
			detected = latest(detected, f.detected)
			for _, p := range f.pods {
				lastGone = latest(lastGone, w.podGone[p])
				if e := w.podEvict[p]; !e.IsZero() && (firstEvict.IsZero() || e.Before(firstEvict)) {
					firstEvict = e
				}
			}
		}
		thresholdAt := r.since.Add(threshold)
		allowed := thresholdAt
		// The last repair that ended before this one was created.
		if i, _ := slices.BinarySearchFunc(ends, r.created, func(e, t time.Time) int { return e.Compare(t) }); i > 0 && ends[i-1].After(allowed) {
			allowed = ends[i-1]
		}
		if allowed.After(r.created) {
			allowed = r.created // created before the threshold by the watch's clock (since has 1 s precision)
		}
		stages.add(burstStages[2], detected, thresholdAt)
		stages.add(burstStages[3], thresholdAt, allowed)
		stages.add(burstStages[4], allowed, r.created)
		stages.add(burstStages[5], r.created, nm.created)
		stages.add(burstStages[6], nm.created, nm.scheduled)
		stages.add(burstStages[7], nm.scheduled, firstEvict)
		stages.add(burstStages[8], firstEvict, lastGone)
		stages.add(burstStages[9], lastGone, nm.ready)
		stages.add(burstStages[10], nm.ready, r.resetPending)
		stages.add(burstStages[11], r.resetPending, r.resetDone)
		stages.add(burstStages[12], r.resetDone, r.validatePend)
		stages.add(burstStages[13], r.validatePend, r.validateDone)
		stages.add(burstStages[14], r.validateDone, r.ended)
		stages.add(burstStages[15], r.ended, nm.gone)
		if !nm.created.IsZero() {
			fromAllowed = append(fromAllowed, nm.created.Sub(allowed))
			if !allowed.After(thresholdAt) {
				rep.DispatchAllowed++
				if nm.created.Sub(thresholdAt) <= 5*time.Second {
					rep.DispatchWithin5s++
				}
			}
		}
		for _, f := range mine {
			back = latest(f.gfClear, f.dtrGone)
			stages.add(burstStages[16], r.validatePend, back)
			var gone time.Time
			for _, p := range f.pods {
				gone = latest(gone, w.podGone[p])
			}
			from.add(burstMilestones[2], f.injected, r.created)
			from.add(burstMilestones[3], f.injected, nm.created)
			from.add(burstMilestones[4], f.injected, nm.scheduled)
			from.add(burstMilestones[5], f.injected, gone)
			from.add(burstMilestones[6], f.injected, r.resetPending)
		}
	}
	slowest := slices.Clone(w.faults)
	isolation := func(f *gpuFault) time.Duration {
		if f.isolated.IsZero() || f.detected.IsZero() {
			return time.Duration(math.MaxInt64)
		}
		return f.isolated.Sub(f.detected)
	}
	slices.SortFunc(slowest, func(a, b *gpuFault) int { return cmp.Compare(isolation(b), isolation(a)) })
	for _, f := range slowest[:min(3, len(slowest))] {
		rep.SlowestIsolations = append(rep.SlowestIsolations, fmt.Sprintf("node %s GPU %d (%s): detected +%.1f s, isolated +%.1f s; notes %s",
			f.node, f.gpu, f.gfName, f.detected.Sub(f.injected).Seconds(), f.isolated.Sub(f.injected).Seconds(), strings.Join(f.notes, ", ")))
	}
	for _, f := range w.faults {
		stages.add(burstStages[0], f.injected, f.detected)
		stages.add(burstStages[1], f.detected, f.isolated)
		from.add(burstMilestones[0], f.injected, f.detected)
		from.add(burstMilestones[1], f.injected, f.isolated)
		if !f.gfClear.IsZero() && !f.dtrGone.IsZero() {
			from.add(burstMilestones[7], f.injected, latest(f.gfClear, f.dtrGone))
		}
	}
	rep.FromFaultMs = from.percentiles()
	rep.StagesMs = stages.percentiles()
	slices.Sort(fromAllowed)
	rep.DispatchFromAllowedMs = percentiles(fromAllowed)
	restarts := slices.Sorted(slices.Values(w.pluginRestarts))
	rep.PluginRestartMs, rep.PluginRestarts, rep.PluginsDownAtEnd = percentiles(restarts), len(restarts), len(w.pluginDown)
	var ev []time.Time
	for _, f := range w.faults {
		for _, p := range f.pods {
			if t := w.podEvict[p]; !t.IsZero() {
				ev = append(ev, t)
			}
		}
	}
	slices.SortFunc(ev, func(a, b time.Time) int { return a.Compare(b) })
	rep.Evictions = len(ev)
	if len(ev) > 1 {
		rep.EvictionsPerSecond = float64(len(ev)-1) / ev[len(ev)-1].Sub(ev[0]).Seconds()
	}
	for i := range ev {
		j := i
		for j < len(ev) && ev[j].Sub(ev[i]) < time.Second {
			j++
		}
		rep.PeakEvictionsPerSec = max(rep.PeakEvictionsPerSec, j-i)
	}
	// Repairs beyond the first of a faulty node (not a limit: reported).
	firstOf := map[string]string{}
	for _, f := range w.faults {
		if f.repair != "" {
			firstOf[f.node] = f.repair
		}
	}
	for _, name := range slices.Sorted(maps.Keys(w.repairs)) {
		r := w.repairs[name]
		if r.phase == repairv1.PhaseIgnored || firstOf[r.node] == name {
			continue
		}
		rep.ExtraRepairs++
		if len(rep.ExtraRepairExamples) < 5 {
			rep.ExtraRepairExamples = append(rep.ExtraRepairExamples, fmt.Sprintf("%s (node %s, %s after its first repair ended): rule %s, %q; %s: %s",
				name, r.node, r.created.Sub(w.repairs[firstOf[r.node]].ended).Round(100*time.Millisecond), r.rule, r.fault, r.phase, r.message))
		}
	}
	return rep
}

func (r burstReportData) markdown() string {
	var s strings.Builder
	p := r.Parameters
	fmt.Fprintf(&s, "# gpufleet GPU fault burst (%s, %s)\n\n", r.Commit, r.Date)
	fmt.Fprintf(&s, "Parameters: %v kwok GPU nodes (%v GPUs each, published in DRA ResourceSlices) in %v pools, 1 admin-cordoned; %v claim pods (%v per node, 1 s termination); "+
		"%v faults (XID %v) injected at once on %d nodes, each on a GPU a claim holds; NodeRepairPolicy: default rules (gpu-reset threshold %v s: ResetGPU, then Reboot), "+
		"maxParallelPools %v, validation %v, drain force; MaintenanceOperatorConfig: maxParallelOperations %v, maxUnavailable %v. Operator: %v. Agents: %v.\n\n",
		p["nodes"], p["gpusPerNode"], p["pools"], p["claimPods"], p["podsPerNode"], p["faults"], p["xid"], r.FaultyNodes, p["gpuResetThresholdSeconds"],
		p["maxParallelPools"], p["validation"], p["maxParallelOperations"], p["maxUnavailable"], p["operator"], p["agents"])
	fmt.Fprintf(&s, "Command: `%s`\n\n", r.Command)
	fmt.Fprintf(&s, "| figure | value |\n|---|---|\n")
	fmt.Fprintf(&s, "| setup (cluster, nodes, claim pods running) | %.0f s |\n", r.SetupSeconds)
	fmt.Fprintf(&s, "| injection: first call to last return | %.0f ms |\n", r.InjectionSpreadMs)
	fmt.Fprintf(&s, "| burst: first injection to every GPU back in service | %.1f s |\n", r.BurstSeconds)
	fmt.Fprintf(&s, "| repairs (by phase) / dry-run or ignored records | %d (%s) / %d |\n", r.Repairs, formatCounts(r.RepairsByPhase), r.IgnoredRecords)
	fmt.Fprintf(&s, "| repairs of a faulty node after its first | %d |\n", r.ExtraRepairs)
	fmt.Fprintf(&s, "| repairs allowed by the limits at their threshold / drain requested within 5 s of the threshold | %d / %d |\n", r.DispatchAllowed, r.DispatchWithin5s)
	fmt.Fprintf(&s, "| from allowed (threshold, or the last repair ended before) to drain requested, p50 / p90 / p99 / max | %s |\n", pct(r.DispatchFromAllowedMs))
	fmt.Fprintf(&s, "| repairs' ResetGPU outcomes / repairs that went on to a reboot | %s / %d |\n", formatCounts(r.ResetOutcomes), r.Rebooted)
	fmt.Fprintf(&s, "| GPU plugin pods taken down and replaced (the replacement bound to the node) / not replaced at the end; eviction → replacement, p50 / p90 / p99 / max | %d / %d; %s |\n",
		r.PluginRestarts, r.PluginsDownAtEnd, pct(r.PluginRestartMs))
	fmt.Fprintf(&s, "| claim pods evicted / evictions per second (first to last) / most in one second | %d / %.2f / %d |\n", r.Evictions, r.EvictionsPerSecond, r.PeakEvictionsPerSec)
	fmt.Fprintf(&s, "| NodeMaintenance scheduling latency from a free slot, p50 / p90 / p99 / max | %s |\n", pct(r.NMSchedulingLatencyMs))
	fmt.Fprintf(&s, "| operator API requests during the burst / per repair | %d / %.1f |\n", sum(r.OperatorRequests), r.RequestsPerRepair)
	fmt.Fprintf(&s, "| simulated agents' API requests during the burst / per repair | %d / %.1f |\n", sum(r.AgentRequests), r.AgentRequestsPerRepair)
	fmt.Fprintf(&s, "| operator CPU during the burst / in all | %.1f / %.1f s |\n", r.CPUSeconds, r.CPUSecondsTotal)
	fmt.Fprintf(&s, "| operator peak RSS / RSS at the end | %.0f / %.0f MB |\n", r.PeakRSSMB, r.RSSMB)
	fmt.Fprintf(&s, "| benchmark process CPU during the burst (simulated agents, checker, watches) / machine CPU busy (all %d cores) / load average before, after | %.1f s / %.0f%% / %s; %s |\n",
		runtime.NumCPU(), r.BenchCPUSeconds, 100*r.MachineCPUBusy, r.LoadAverage[0], r.LoadAverage[1])
	fmt.Fprintf(&s, "| max NodeMaintenance in progress (limit %v) / held or cordoned (limit %v) | %d / %d |\n", p["maxParallelOperations"], p["maxUnavailable"], r.MaxInProgress, r.MaxHeld)
	fmt.Fprintf(&s, "| max repairs in one pool (limit 1) / pools repairing (maxParallelPools %v) | %d / %d |\n", p["maxParallelPools"], r.MaxRepairsPerPool, r.MaxPoolsRepairing)
	fmt.Fprintf(&s, "| invariant checks / violations | %d / %d |\n", r.CheckedEvents, len(r.Violations))
	fmt.Fprintf(&s, "| simulated reset | %s |\n", r.SimulatedResetNote)
	fmt.Fprintf(&s, "| simulated validation | %s |\n\n", r.SimulatedValidation)
	fmt.Fprintf(&s, "From each fault's injection (%d faults; p50 / p90 / p99 / max):\n\n| milestone | faults | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|\n", r.Faults)
	for _, m := range burstMilestones {
		d := r.FromFaultMs[m]
		fmt.Fprintf(&s, "| %s | %v | %s |\n", m, d["count"], pctCols(d))
	}
	fmt.Fprintf(&s, "\nWhere the time goes (per repair, per fault for the first two and the last; wait = limits or the policy's threshold, work = gpufleet or the simulation):\n\n| stage | n | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|\n")
	for _, st := range burstStages {
		d := r.StagesMs[st]
		fmt.Fprintf(&s, "| %s | %v | %s |\n", st, d["count"], pctCols(d))
	}
	fmt.Fprintf(&s, "\nTargets: isolation p99 under 1 s: %.0f ms (%s); every repair the limits allow dispatched within 5 s of its threshold: %d of %d.\n\n",
		r.FromFaultMs[burstMilestones[1]]["p99"], map[bool]string{true: "met", false: "NOT met"}[r.FromFaultMs[burstMilestones[1]]["p99"] < 1000],
		r.DispatchWithin5s, r.DispatchAllowed)
	fmt.Fprintf(&s, "NVSentinel's published figures (%s), beside gpufleet's p50 / p99 here:\n\n| | NVSentinel | gpufleet |\n|---|---|---|\n", r.NVSentinel["source"])
	fmt.Fprintf(&s, "| fault → quarantined (gpufleet: the GPU isolated by a DeviceTaintRule; NVSentinel cordons the node) | %s | %s |\n",
		r.NVSentinel["fault → quarantined"], p50p99(r.FromFaultMs[burstMilestones[1]]))
	fmt.Fprintf(&s, "| fault → remediation dispatched (gpufleet: ResetGPU pending, after the drain; its threshold is %v s) | %s | %s |\n",
		p["gpuResetThresholdSeconds"], r.NVSentinel["fault → remediation dispatched"], p50p99(r.FromFaultMs[burstMilestones[6]]))
	fmt.Fprintf(&s, "| fault → back in service without reboot | %s | %s |\n", r.NVSentinel["fault → back in service without reboot"], p50p99(r.FromFaultMs[burstMilestones[7]]))
	fmt.Fprintf(&s, "| drain rate | %s | %.2f evictions/s (first to last eviction), at most %d in one second |\n\n", r.NVSentinel["drain"], r.EvictionsPerSecond, r.PeakEvictionsPerSec)
	fmt.Fprintf(&s, "The two runs differ: NVSentinel's limits, thresholds and hardware are its own; here every repair waits for one repair per pool, maxParallelPools and the NodeMaintenance limits.\n\n")
	if len(r.SlowestIsolations) > 0 {
		fmt.Fprintf(&s, "The faults isolated last after their detection:\n\n- %s\n\n", strings.Join(r.SlowestIsolations, "\n- "))
	}
	if len(r.FailedRepairs) > 0 {
		fmt.Fprintf(&s, "Repairs that failed:\n\n- %s\n\n", strings.Join(r.FailedRepairs, "\n- "))
	}
	if len(r.Controllers) > 0 {
		fmt.Fprintf(&s, "The operator's controllers during the burst (reconciles by result; retries after an error; a key's wait in the queue, p50 / p99):\n\n- %s\n\n", strings.Join(r.Controllers, "\n- "))
	}
	if q := r.SimPluginQueueMs; q["count"] > 0 {
		fmt.Fprintf(&s, "The simulated GPU plugins (one loop for every node, in the benchmark's process): %.0f passes during the burst; a node's wait in their queue p50 %.1f ms, p99 %.1f ms, max %.1f ms.\n\n",
			q["count"], q["p50"], q["p99"], q["max"])
	}
	fmt.Fprintf(&s, "Operator requests during the burst: %s\n\nAgent requests during the burst: %s\n", formatCounts(r.OperatorRequests), formatCounts(r.AgentRequests))
	if len(r.ExtraRepairExamples) > 0 {
		fmt.Fprintf(&s, "\nRepairs after a node's first:\n\n")
		for _, e := range r.ExtraRepairExamples {
			fmt.Fprintf(&s, "- %s\n", e)
		}
	}
	if len(r.OpenAtEnd) > 0 {
		fmt.Fprintf(&s, "\nOpen at the end:\n\n- %s\n", strings.Join(r.OpenAtEnd, "\n- "))
	}
	if len(r.Violations) > 0 {
		fmt.Fprintf(&s, "\nViolations:\n\n")
		for _, v := range r.Violations {
			fmt.Fprintf(&s, "- %s\n", v)
		}
	}
	return s.String()
}

// savePprof writes one of the operator's pprof endpoints (e.g.
// "profile?seconds=60") to path.
func savePprof(addr, endpoint, path string) error {
	c := &http.Client{Timeout: 3 * time.Minute}
	resp, err := c.Get("http://" + addr + "/debug/pprof/" + endpoint)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // read side: nothing to lose
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/%s: %s", endpoint, resp.Status)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// loadAverage is the 1, 5 and 15 minute load averages of /proc/loadavg.
func loadAverage() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// machineCPU reads the machine's busy and total CPU time (jiffies) from
// /proc/stat.
func machineCPU() (busy, total float64) {
	data, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	for i := 1; i < len(f); i++ {
		v, _ := strconv.ParseFloat(f[i], 64)
		total += v
		if i != 4 && i != 5 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

func pct(d map[string]float64) string {
	if d["count"] == 0 {
		return "none"
	}
	return fmt.Sprintf("%.0f / %.0f / %.0f / %.0f ms", d["p50"], d["p90"], d["p99"], d["max"])
}

func pctCols(d map[string]float64) string {
	if d["count"] == 0 {
		return "– | – | – | –"
	}
	f := func(v float64) string {
		if v >= 10000 || v <= -10000 {
			return fmt.Sprintf("%.1f s", v/1000)
		}
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%s | %s | %s | %s", f(d["p50"]), f(d["p90"]), f(d["p99"]), f(d["max"]))
}

func p50p99(d map[string]float64) string {
	if d["count"] == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %.2f s, p99 %.2f s", d["p50"]/1000, d["p99"]/1000)
}

func writeBurstReport(b *testing.B, r burstReportData, md string) {
	base := writeReport(b, reportDir(b, *burstReport), fmt.Sprintf("burst-%d", r.Parameters["nodes"]), r, md)
	b.Logf("report: %s.json, %s.md", base, base)
}

// controllerLines describes each operator controller's work between two
// scrapes of its metrics: reconciles by result, retries after an error,
// and the p50 / p99 of a key's wait in the controller's queue.
func controllerLines(before, after map[string]*dto.MetricFamily) []string {
	const family = "controller_runtime_reconcile_total"
	results := diffCounts(countsByLabel(before, family, "controller", "result"), countsByLabel(after, family, "controller", "result"))
	retries := diffCounts(countsByLabel(before, "workqueue_retries_total", "name"), countsByLabel(after, "workqueue_retries_total", "name"))
	perController := map[string]map[string]int{}
	for k, n := range results {
		c, r, _ := strings.Cut(k, "\x00")
		if n == 0 {
			continue
		}
		if perController[c] == nil {
			perController[c] = map[string]int{}
		}
		perController[c][r] = n
	}
	var out []string
	for _, c := range slices.Sorted(maps.Keys(perController)) {
		q := histogramQuantilesMs(after, "workqueue_queue_duration_seconds", map[string]string{"name": c}, 0.5, 0.99)
		out = append(out, fmt.Sprintf("%s: %s; retries %d; queue wait %.0f / %.0f ms (over the operator's life)",
			c, formatCounts(perController[c]), retries[c], q["p50"], q["p99"]))
	}
	return out
}

// openRepairWork describes the repairs and NodeMaintenance objects still
// open: a repair's last timeline step and message; a NodeMaintenance's
// phase and condition, with the pods of its node being deleted (how long
// since, their finalizers and phase).
func openRepairWork(ctx context.Context, env *devcluster.Env) []string {
	var out []string
	var repairs repairv1.NodeRepairList
	if err := env.Kube.List(ctx, &repairs); err != nil {
		return []string{"listing NodeRepairs: " + err.Error()}
	}
	for _, r := range repairs.Items {
		if r.Status.Phase != repairv1.PhaseRepairing && r.Status.Phase != "" {
			continue
		}
		last := "none"
		if e := r.LastEntry(); e != nil {
			last = fmt.Sprintf("%s %s %s ago: %s", e.Step, e.Outcome, time.Since(e.Time.Time).Round(time.Second), e.Message)
		}
		out = append(out, fmt.Sprintf("NodeRepair %s (node %s): last step %s; message %q", r.Name, r.Spec.NodeName, last, r.Status.Message))
	}
	var nms maintenancev1.NodeMaintenanceList
	if err := env.Kube.List(ctx, &nms); err != nil {
		return append(out, "listing NodeMaintenances: "+err.Error())
	}
	for _, nm := range nms.Items {
		if nm.IsReady() {
			continue
		}
		cond := "no Ready condition"
		if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady); c != nil {
			cond = fmt.Sprintf("Ready %s %s since %s: %s", c.Status, c.Reason, time.Since(c.LastTransitionTime.Time).Round(time.Second), c.Message)
		}
		line := fmt.Sprintf("NodeMaintenance %s (node %s, requestor %s): %s", nm.Name, nm.Spec.NodeName, nm.Spec.RequestorID, cond)
		pods, err := env.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nm.Spec.NodeName})
		if err != nil {
			line += "; listing its node's pods: " + err.Error()
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				line += fmt.Sprintf("; pod %s/%s deleted %s ago (phase %s, finalizers %v)", p.Namespace, p.Name, time.Since(p.DeletionTimestamp.Time).Round(time.Second), p.Status.Phase, p.Finalizers)
			}
		}
		out = append(out, line)
	}
	slices.Sort(out)
	return out
}
