package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// GPUSource tells what a node's GPUs show now: the kernel log's XIDs and
// dcgm-exporter's counters (the real host), or the simulation's view of
// a kwok node. It reads, it decides nothing.
type GPUSource interface {
	ObserveGPUs(ctx context.Context, node *corev1.Node) (GPUObservation, error)
}

// GPUMonitor keeps a node's GPUFault records and GPUProblem condition in
// line with what its GPU source shows. A request names a node. Each pass
// reads the node, its records, the policies (for XID class overrides)
// and the source, runs DetectGPUFaults and writes what changed: the
// records (create, spec and status patches with optimistic lock), then the
// node's condition (a status patch of that condition only). Nothing
// changed, nothing written.
type GPUMonitor struct {
	Client API
	Source GPUSource
	Clock  clock.PassiveClock
	// NodeName is the agent's node; empty: every node (the simulation).
	NodeName string

	// podResourcesDown: the source's pod-resources API failed last time
	// (logged once per outage).
	podResourcesDown atomic.Bool
}

// Reconcile looks at one node's GPUs. requeueAfter > 0: look again then
// (an error is retried with backoff).
func (m *GPUMonitor) Reconcile(ctx context.Context, nodeName string) (requeueAfter time.Duration, err error) {
	if m.NodeName != "" && nodeName != m.NodeName {
		return 0, nil
	}
	node, err := m.Client.Node(ctx, nodeName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		return 0, err
	}
	records, err := nodeRecords(ctx, m.Client, node.Name)
	if err != nil {
		return 0, err
	}
	policies, err := m.Client.NodeRepairPolicies(ctx)
	if err != nil {
		return 0, fmt.Errorf("listing repair policies: %w", err)
	}
	obs, err := m.Source.ObserveGPUs(ctx, node)
	if err != nil {
		return 0, fmt.Errorf("observing the GPUs of node %s: %w", node.Name, err)
	}
	slices, err := m.Client.ResourceSlices(ctx, node.Name)
	if err != nil {
		return 0, fmt.Errorf("listing the ResourceSlices of node %s: %w", node.Name, err)
	}
	obs.DeviceTaints = DeviceTaintsOf(slices, DRADriversFor(node, policies), node.Name)
	now := m.Clock.Now()
	writes := DetectGPUFaults(GPUState{
		Node: node.Name, BootID: node.Status.NodeInfo.BootID, Capacity: gpuCapacity(node),
		Records: records, Observed: obs, XIDClasses: XIDClassesFor(node, policies),
	}, now)
	writes, poll := m.withAllocations(ctx, node, records, writes)
	after, err := writeRecords(ctx, m.Client, records, writes)
	if err == nil {
		err = writeCondition(ctx, m.Client, node, after, now)
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		// Written on a version older than the stored one (the cache had
		// not seen a write yet): look again on fresh objects.
		crlog.FromContext(ctx).V(1).Info("looking again: an object changed since it was read", "error", err.Error())
		return conflictRetry, nil
	}
	if err != nil {
		return 0, err
	}
	if poll {
		return podResourcesPoll, nil
	}
	return 0, nil
}

// withAllocations records, on the records of out-of-service GPUs, which
// pods hold them (WithAllocations), when the source can tell: it asks only
// while a GPU of the node is out of service. poll: ask again later (the
// pod-resources API has no watch).
func (m *GPUMonitor) withAllocations(ctx context.Context, node *corev1.Node, records map[string]repairv1.GPUFault,
	writes []repairv1.GPUFault) ([]repairv1.GPUFault, bool) {
	src, ok := m.Source.(GPUPodsSource)
	if !ok || !anyOutOfService(records, writes) {
		return WithAllocations(records, writes, nil, false), false
	}
	allocs, err := src.GPUPods(ctx, node)
	switch {
	case errors.Is(err, ErrNoPodResources):
		return WithAllocations(records, writes, nil, false), false
	case err != nil:
		if m.podResourcesDown.CompareAndSwap(false, true) {
			crlog.FromContext(ctx).Info("cannot tell which pods hold the faulty GPUs; the repair drains every GPU pod of the node",
				"node", klog.KObj(node), "error", err.Error())
		}
		return WithAllocations(records, writes, nil, false), true
	}
	if m.podResourcesDown.CompareAndSwap(true, false) {
		crlog.FromContext(ctx).Info("pod-resources API readable again", "node", klog.KObj(node))
	}
	return WithAllocations(records, writes, allocs, true), true
}

// anyOutOfService reports whether a record, as written or as read, shows a
// GPU out of service.
func anyOutOfService(records map[string]repairv1.GPUFault, writes []repairv1.GPUFault) bool {
	written := map[string]bool{}
	for i := range writes {
		written[writes[i].Name] = true
		if !writes[i].InService() {
			return true
		}
	}
	for name, r := range records {
		if !written[name] && !r.InService() {
			return true
		}
	}
	return false
}

// conflictRetry is how soon the monitor looks again after a write lost to
// a newer version.
const conflictRetry = 100 * time.Millisecond

// ClearResetGPUs returns the GPUs a successful ResetGPU reset to service
// (ResetDone on the node's records), then updates the node's GPUProblem
// condition. A write that conflicts with the monitor's is done again on
// fresh records.
func ClearResetGPUs(ctx context.Context, c API, clk clock.PassiveClock, nodeName string, gpus []repairv1.GPURef) error {
	return updateRecords(ctx, c, clk, nodeName, func(list []repairv1.GPUFault) []repairv1.GPUFault { return ResetDone(list, gpus) })
}

// AwaitValidation marks the reset GPUs as waiting for their validation
// (ValidationPending): they stay out of service until its result.
func AwaitValidation(ctx context.Context, c API, clk clock.PassiveClock, nodeName string, gpus []repairv1.GPURef) error {
	return updateRecords(ctx, c, clk, nodeName, func(list []repairv1.GPUFault) []repairv1.GPUFault {
		return ValidationPending(list, gpus, clk.Now())
	})
}

// GPUValidated is one GPU's validation result.
type GPUValidated struct {
	GPU    repairv1.GPURef
	Result repairv1.GPUValidationResult
}

// RecordValidation writes the validation results on the GPUs' records
// (ValidationDone, each GPU its own result) and the node's GPUProblem
// condition, in one update.
func RecordValidation(ctx context.Context, c API, clk clock.PassiveClock, nodeName string, results []GPUValidated, failed repairv1.GPUFaultClass) error {
	return updateRecords(ctx, c, clk, nodeName, func(list []repairv1.GPUFault) []repairv1.GPUFault {
		var writes []repairv1.GPUFault
		for _, v := range results { // each result changes its GPU's record only
			writes = append(writes, ValidationDone(list, []repairv1.GPURef{v.GPU}, v.Result, failed)...)
		}
		return writes
	})
}

// updateRecords writes what decide makes of the node's records, and the
// node's GPUProblem condition, reading again after a conflict (with the
// GPU monitor, or with the node's own status updates): from the API server
// then, since a cache that was behind stays behind for a while — on a busy
// cluster six reads of the cache in 3 s all conflicted, and a reset that
// had worked was recorded as failed, which sends the repair on to a reboot.
func updateRecords(ctx context.Context, c API, clk clock.PassiveClock, nodeName string, decide func([]repairv1.GPUFault) []repairv1.GPUFault) error {
	backoff := wait.Backoff{Steps: 10, Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.1, Cap: 5 * time.Second}
	read := c
	return retry.OnError(backoff, apierrors.IsConflict, func() error {
		defer func() { read = c.Fresh() }()
		records, err := nodeRecords(ctx, read, nodeName)
		if err != nil {
			return err
		}
		list := make([]repairv1.GPUFault, 0, len(records))
		for _, r := range records {
			list = append(list, r)
		}
		after, err := writeRecords(ctx, c, records, decide(list))
		if err != nil {
			return err
		}
		node, err := read.Node(ctx, nodeName)
		if err != nil {
			return fmt.Errorf("reading node %s: %w", nodeName, err)
		}
		return writeCondition(ctx, c, node, after, clk.Now())
	})
}

// nodeRecords returns the node's GPUFault records by name.
func nodeRecords(ctx context.Context, c API, node string) (map[string]repairv1.GPUFault, error) {
	list, err := c.GPUFaults(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("listing GPU fault records: %w", err)
	}
	out := map[string]repairv1.GPUFault{}
	for _, r := range list {
		if r.Spec.NodeName == node {
			out[r.Name] = r
		}
	}
	return out, nil
}

// writeRecords writes the records the core decided on and returns the
// node's records as they are after the writes. A new record is created,
// then its status written (create ignores the status subresource); a
// changed one gets a spec patch and/or a status patch, each failing with a
// conflict if the record changed since it was read.
func writeRecords(ctx context.Context, c API, old map[string]repairv1.GPUFault, writes []repairv1.GPUFault) (map[string]repairv1.GPUFault, error) {
	log := crlog.FromContext(ctx)
	after := make(map[string]repairv1.GPUFault, len(old)+len(writes))
	for k, v := range old {
		after[k] = v
	}
	for _, w := range writes {
		cur, existed := old[w.Name]
		if !existed {
			obj := w.DeepCopy()
			obj.Status = repairv1.GPUFaultStatus{}
			if err := c.CreateGPUFault(ctx, obj); err != nil {
				return after, fmt.Errorf("creating GPU fault record %s: %w", w.Name, err)
			}
			cur = *obj
		}
		if !equality.Semantic.DeepEqual(cur.Spec, w.Spec) {
			upd := cur.DeepCopy()
			upd.Spec = w.Spec
			if err := c.PatchGPUFault(ctx, &cur, upd); err != nil {
				return after, fmt.Errorf("updating the GPU of record %s: %w", w.Name, err)
			}
			cur = *upd
		}
		if !equality.Semantic.DeepEqual(cur.Status, w.Status) {
			upd := cur.DeepCopy()
			upd.Status = w.Status
			if err := c.PatchGPUFaultStatus(ctx, &cur, upd); err != nil {
				return after, fmt.Errorf("writing the status of GPU fault record %s: %w", w.Name, err)
			}
			cur = *upd
		}
		after[w.Name] = cur
		if old[w.Name].Status.Class != w.Status.Class || !existed {
			log.Info("GPU fault record written", "gpufault", klog.KObj(&cur), "node", w.Spec.NodeName,
				"gpu", w.Spec.GPU.Describe(), "class", w.Status.Class, "faults", w.Status.Summary)
		}
	}
	return after, nil
}

// writeCondition writes the node's GPUProblem condition when it changed:
// a strategic merge patch of that one condition of the node's status, on
// the node's version that was read (a conflict if it changed since, so
// that a stale read cannot write the condition twice).
func writeCondition(ctx context.Context, c API, node *corev1.Node, records map[string]repairv1.GPUFault, now time.Time) error {
	list := make([]repairv1.GPUFault, 0, len(records))
	for _, r := range records {
		list = append(list, r)
	}
	cond := GPUProblemCondition(node.Status.Conditions, list, now)
	if cond == nil {
		return nil
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"status": map[string]any{"conditions": []corev1.NodeCondition{*cond}}})
	if err != nil {
		return err
	}
	if err := c.PatchNodeStatus(ctx, node, data); err != nil {
		return fmt.Errorf("writing condition %s of node %s: %w", cond.Type, node.Name, err)
	}
	crlog.FromContext(ctx).Info("node condition written", "node", klog.KObj(node), "condition", cond.Type,
		"status", cond.Status, "reason", cond.Reason, "message", cond.Message)
	return nil
}

func gpuCapacity(node *corev1.Node) int {
	q, ok := node.Status.Capacity[ResourceGPU]
	if !ok {
		return 0
	}
	return int(min(max(q.Value(), 0), 1<<16))
}

// ResourceGPU is the extended resource of NVIDIA's device plugin.
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"

// gpuNodeChanged passes node updates the monitor must look at: a new boot,
// a changed GPU capacity, changed annotations (the simulated host keeps
// its state there) and a GPUProblem condition someone else changed —
// not the kubelet's heartbeats.
func gpuNodeChanged(o, n *corev1.Node) bool {
	return o.Status.NodeInfo.BootID != n.Status.NodeInfo.BootID || gpuCapacity(o) != gpuCapacity(n) ||
		!equality.Semantic.DeepEqual(o.Annotations, n.Annotations) || gpuProblem(o) != gpuProblem(n)
}

func gpuProblem(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == repairv1.ConditionGPUProblem {
			return string(c.Status) + "/" + c.Reason + "/" + c.Message
		}
	}
	return ""
}

// gpuFaultChanged passes record updates other than the monitor's own
// no-op resyncs: a record's status or spec changed (e.g. someone edited
// it, or ClearResetGPUs wrote it).
func gpuFaultChanged(o, n *repairv1.GPUFault) bool {
	return o.Generation != n.Generation || !equality.Semantic.DeepEqual(o.Status, n.Status)
}

// xidClassesChanged passes policies whose XID classes or node selector
// changed.
func xidClassesChanged(o, n *repairv1.NodeRepairPolicy) bool {
	return !equality.Semantic.DeepEqual(o.Spec.GPU.XIDClasses, n.Spec.GPU.XIDClasses) ||
		!equality.Semantic.DeepEqual(o.Spec.NodeSelector, n.Spec.NodeSelector)
}
