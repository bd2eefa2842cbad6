package repair

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
)

// How a repair holds its node, and what it never does while it does: it
// waits, bounded, for its NodeMaintenance to hold the node; it never
// reboots under pods the reboot would end; and it keeps a node whose GPU
// failed after the reboot cordoned when nothing else keeps that GPU out of
// service.

// awaitHold waits for the repair's NodeMaintenance name to hold the node:
// Ready, or past its drain timeout — the only case in which a repair goes
// on without a finished drain (a drain refused at once is not one). It
// returns the object once it holds the node (nil: not yet, with when to
// look again, or the repair ended). Every wait is bounded, with the reason
// on the repair: an object gone (the API server asked, not only the
// cache) ends the repair, and so does one that does not hold the node
// within maintenanceTimeoutSeconds plus its drain's timeout.
func (r *Repairer) awaitHold(ctx context.Context, l *ladder, name string) (*maintenancev1.NodeMaintenance, reconcile.Result, error) {
	nr := l.nr
	nm, err := requestor.Get(ctx, r.Client, r.Namespace, name)
	if err == nil && nm == nil {
		nm, err = requestor.Get(ctx, r.Live, r.Namespace, name) // the cache may not show a new object yet
	}
	if err != nil {
		return nil, reconcile.Result{}, err
	}
	if nm == nil || nm.DeletionTimestamp != nil {
		return nil, reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed, fmt.Sprintf(
			"NodeMaintenance %s/%s, which was to hold node %s, was deleted before the repair was done with it; not going on", r.Namespace, name, l.node.Name))
	}
	if nm.IsReady() || nm.DrainTimedOut() {
		nr.Status.Message = ""
		return nm, reconcile.Result{}, nil
	}
	if nr.Status.MaintenanceRequestedAt == nil {
		nr.Status.MaintenanceRequestedAt = ptr.To(metav1.NewTime(l.now)) // requested by an older version: the bound counts from now
	}
	limit := seconds(l.policy.Spec.MaintenanceTimeoutSeconds, defaultMaintenanceTimeout)
	if d := nm.Spec.DrainSpec; d != nil && d.TimeoutSeconds != nil {
		limit += time.Duration(*d.TimeoutSeconds) * time.Second
	}
	waited := l.now.Sub(nr.Status.MaintenanceRequestedAt.Time)
	if waited >= limit {
		return nil, reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed, fmt.Sprintf(
			"NodeMaintenance %s/%s did not hold node %s within %s (maintenanceTimeoutSeconds and the drain's timeout): %s",
			r.Namespace, name, l.node.Name, limit, maintenanceWait(nm)))
	}
	nr.Status.Message = maintenanceWait(nm)
	return nil, reconcile.Result{RequeueAfter: limit - waited}, nil // the NodeMaintenance watch brings us back sooner
}

// holdForReplacement decides, for a GPU repair failing after its reboot,
// whether its NodeMaintenance keeps the node cordoned: when one of its
// GPUs is out of service and no DeviceTaintRule isolates it (a node whose
// GPUs the device plugin gives out, which forgot its unhealthy GPUs with
// the reboot), releasing the node would give that GPU to the next pod.
// It returns what to add to the repair's message ("" when nothing holds).
func (r *Repairer) holdForReplacement(ctx context.Context, l *ladder) (string, error) {
	nr := l.nr
	if len(nr.Spec.GPUs) == 0 || nr.Status.MaintenanceName == "" {
		return "", nil
	}
	var records repairv1.GPUFaultList
	if err := r.Client.List(ctx, &records, client.MatchingFields{indexGPUNode: l.node.Name}); err != nil {
		return "", fmt.Errorf("listing the GPUFaults of node %s: %w", l.node.Name, err)
	}
	var open []string
	for _, gf := range outOfService(l.node.Name, records.Items) {
		if !slices.ContainsFunc(nr.Spec.GPUs, func(g repairv1.GPURef) bool { return g.PCIBusID == gf.Spec.GPU.PCIBusID }) {
			continue
		}
		var rule resourcev1.DeviceTaintRule
		if r.DRA {
			err := r.Client.Get(ctx, types.NamespacedName{Name: ruleName(gf)}, &rule)
			if err == nil {
				continue // isolated: the node may go back to work without it
			}
			if !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
				return "", fmt.Errorf("reading the DeviceTaintRule of %s: %w", gf.Spec.GPU.Describe(), err)
			}
		}
		open = append(open, gf.Spec.GPU.Describe())
	}
	if len(open) == 0 {
		return "", nil
	}
	nr.Status.HeldForReplacement = nr.Status.MaintenanceName
	return fmt.Sprintf("; node %s stays cordoned by NodeMaintenance %s/%s until a person acts: no DeviceTaintRule isolates %s, and the device plugin, started afresh by the reboot, would give it out again; delete that NodeMaintenance (or this NodeRepair) once it is replaced",
		l.node.Name, r.Namespace, nr.Status.MaintenanceName, strings.Join(open, ", ")), nil
}

// rebootEnds names the pods a reboot of their node would end: running or
// about to, and not ones a drain leaves (DaemonSet pods, static pods'
// mirrors), which come back with the node.
func rebootEnds(pods []corev1.Pod) []string {
	var out []string
	for i := range pods {
		p := &pods[i]
		if requestor.SurvivesDrain(p) || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, p.Namespace+"/"+p.Name)
	}
	slices.Sort(out)
	return out
}

// summarize joins up to n names and says how many more there are.
func summarize(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
