package gpustack

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
)

// Driver upgrades go through NodeMaintenance so that the cluster's
// maintenance limits apply to them like to any other disruption.
const (
	// UpgradeRequestor is the requestorID of gpufleet's driver upgrades.
	UpgradeRequestor = "driver-upgrade.gpufleet.nvidia.com"
	// annotationRestartedAt on the NodeMaintenance records when the old
	// driver pod was deleted (the upgrade timeout counts from there).
	annotationRestartedAt = "gpufleet.dev/driver-pod-restarted-at"

	upgradeStateUpgrading = "upgrading"
	upgradeStateRebooting = "rebooting"
	upgradeStateFailed    = "failed"
	// LabelRebootOf marks the NodeRepair a driver upgrade asked for, with
	// the node as its value.
	LabelRebootOf = "gpufleet.dev/driver-upgrade-reboot"
	// RuleModuleInUse is the fault of the reboot a driver upgrade asks for.
	RuleModuleInUse = "driver-module-in-use"

	ReasonUpgradeStarted  = "DriverUpgradeStarted"
	ReasonUpgradeDone     = "DriverUpgraded"
	ReasonUpgradeFailed   = "DriverUpgradeFailed" // Warning
	ReasonModuleInUse     = "DriverModuleInUse"   // Warning
	actionUpgrade         = "UpgradeDriver"
	defaultUpgradeTimeout = 10 * time.Minute
)

// UpgradeNode is what the upgrade planner knows about one GPU node.
type UpgradeNode struct {
	Name string
	// DriverPod is the node's driver pod ("" = none); Current reports
	// whether it runs the desired image, Ready whether it is Ready.
	DriverPod string
	// DriverPodCreated is when the driver pod was created.
	DriverPodCreated  time.Time
	Current, Ready    bool
	ValidatorReady    bool
	Failed            bool // labelled failed by an earlier attempt
	Maintenance       *maintenancev1.NodeMaintenance
	MaintenanceIsOurs bool
	// ModuleInUse is the driver pod's report that the old kernel module
	// could not be unloaded ("" = none): only a reboot frees it.
	ModuleInUse string
	// Reboot is the reboot this upgrade asked for (nil = none).
	Reboot *UpgradeReboot
	// Domain is the node's NVLink domain: the value of the maintenance
	// config's spec.domains.nodeLabel ("" = in no domain).
	Domain string
}

// UpgradeReboot is the state of the NodeRepair a driver upgrade asked for.
type UpgradeReboot struct {
	Name    string
	Phase   repairv1.Phase // "" until the repair controller starts it
	Message string
	Created time.Time
	// Ended is when it finished (the repair's last timeline entry).
	Ended time.Time
}

func (b *UpgradeReboot) done() bool {
	return b.Phase != "" && b.Phase != repairv1.PhaseRepairing
}

// UpgradeAction is one step the controller takes.
type UpgradeAction struct {
	Kind string // Request, RestartDriver, Reboot, Finish, Fail, ClearFailed
	Node string
}

// Upgrade action kinds.
const (
	ActRequest       = "Request"       // create the NodeMaintenance
	ActRestartDriver = "RestartDriver" // delete the old driver pod
	ActDrainNode     = "DrainNode"     // widen the NodeMaintenance's drain to the whole node, for a reboot
	ActReboot        = "Reboot"        // ask the repair engine for a reboot
	ActFinish        = "Finish"        // delete the NodeMaintenance
	ActFail          = "Fail"          // mark failed, release the node
	ActClearFailed   = "ClearFailed"   // a failed node is fine again
)

// PlanUpgrades decides the next step of every node's driver upgrade. At
// most limit nodes are in an upgrade at once (failed ones do not count);
// a node whose new driver is not Ready within timeout of its restart fails.
// A new driver that cannot load because the old kernel module is still in
// use gets one reboot, inside the upgrade's NodeMaintenance; the timeout
// then counts from the end of the reboot, whose own wait is bounded by the
// repair engine.
//
// byDomain (the maintenance config's spec.domains.upgradeByDomain) starts
// the upgrade of every node of a domain at once: see upgradeRequests.
func PlanUpgrades(nodes []UpgradeNode, limit int, byDomain bool, timeout time.Duration, now time.Time) []UpgradeAction {
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	var acts []UpgradeAction
	requested := upgradeRequests(nodes, limit, byDomain)
	for _, n := range nodes {
		nm := n.Maintenance
		switch {
		case n.MaintenanceIsOurs && nm.DrainTimedOut() && !DrainsForReboot(nm.Spec.DrainSpec):
			// The GPU pods did not all leave within the drain's timeout:
			// restarting the driver under them would end them, so the
			// node's upgrade fails instead (as NVIDIA's upgrade does).
			acts = append(acts, UpgradeAction{ActFail, n.Name})
		case n.MaintenanceIsOurs && !holds(nm):
			// waiting for the maintenance scheduler and the drain (for
			// a reboot: the whole node's, or its timeout)
		case n.MaintenanceIsOurs && !n.Current:
			restarted, err := time.Parse(time.RFC3339, nm.Annotations[annotationRestartedAt])
			switch {
			case err != nil && n.DriverPod != "":
				acts = append(acts, UpgradeAction{ActRestartDriver, n.Name})
			case err != nil:
				// no driver pod yet: the DaemonSet creates it
			case now.Sub(restarted) >= timeout:
				// Still not the new driver (e.g. the DaemonSet keeps the
				// old image): the wait is bounded like any other.
				acts = append(acts, UpgradeAction{ActFail, n.Name})
			case n.DriverPod != "" && n.DriverPodCreated.Add(time.Second).Before(restarted):
				// The restart was recorded but the old pod is still there
				// (the operator stopped between the two writes): delete it
				// again. A pod created since the restart is left alone.
				acts = append(acts, UpgradeAction{ActRestartDriver, n.Name})
			}
		case n.MaintenanceIsOurs && n.Ready && n.ValidatorReady && (n.Reboot == nil || n.Reboot.done()):
			acts = append(acts, UpgradeAction{ActFinish, n.Name})
		case n.MaintenanceIsOurs && n.Reboot != nil:
			b := n.Reboot
			switch {
			case b.Phase == repairv1.PhaseSucceeded && now.Sub(b.Ended) >= timeout,
				b.done() && b.Phase != repairv1.PhaseSucceeded,
				// Never started (is the repair capability running?).
				b.Phase == "" && now.Sub(b.Created) >= timeout:
				acts = append(acts, UpgradeAction{ActFail, n.Name})
			}
		case n.MaintenanceIsOurs && n.ModuleInUse != "" && nm.Annotations[annotationRestartedAt] != "" && !DrainsForReboot(nm.Spec.DrainSpec):
			// The reboot would end every pod of the node, not only the GPU
			// pods the upgrade drained: the whole node is drained first.
			acts = append(acts, UpgradeAction{ActDrainNode, n.Name})
		case n.MaintenanceIsOurs && n.ModuleInUse != "" && nm.Annotations[annotationRestartedAt] != "":
			acts = append(acts, UpgradeAction{ActReboot, n.Name})
		case n.MaintenanceIsOurs:
			if restarted, err := time.Parse(time.RFC3339, nm.Annotations[annotationRestartedAt]); err == nil && now.Sub(restarted) >= timeout {
				acts = append(acts, UpgradeAction{ActFail, n.Name})
			}
		case n.Failed && n.Current && n.Ready:
			acts = append(acts, UpgradeAction{ActClearFailed, n.Name})
		case requested[n.Name]:
			acts = append(acts, UpgradeAction{ActRequest, n.Name})
		}
	}
	return acts
}

// holds reports whether the upgrade's NodeMaintenance holds its node for
// the upgrade's next step: Ready for the status of its current spec or,
// once its drain was widened for a reboot, past that drain's timeout (the
// reboot then goes on, as a repair's does).
func holds(nm *maintenancev1.NodeMaintenance) bool {
	if nm.Status.ObservedGeneration < nm.Generation {
		return false // the lifecycle has not acted on the latest spec yet
	}
	return nm.IsReady() || (DrainsForReboot(nm.Spec.DrainSpec) && nm.DrainTimedOut())
}

// DrainsForReboot reports whether a drain is one a reboot needs: every pod
// of the node (but DaemonSet and mirror pods), bare and emptyDir pods too
// (the reboot ends them anyway), each evicted with its grace period and
// PodDisruptionBudget.
func DrainsForReboot(d *maintenancev1.DrainSpec) bool {
	return d != nil && d.Force && d.DeleteEmptyDir && d.PodSelector == "" && len(d.PodEvictionFilters) == 0
}

// rebootDrain is the drain of a node about to reboot inside an upgrade's
// NodeMaintenance: the whole node, within the upgrade's drain timeout.
func rebootDrain(d *maintenancev1.DrainSpec) *maintenancev1.DrainSpec {
	out := &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](300)}
	if d != nil && d.TimeoutSeconds != nil {
		out.TimeoutSeconds = ptr.To(*d.TimeoutSeconds)
	}
	return out
}

// needsRequest: the node runs an old driver and nothing holds it, so its
// upgrade may start.
func (n *UpgradeNode) needsRequest() bool {
	return !n.Current && n.DriverPod != "" && !n.Failed && n.Maintenance == nil
}

// upgradeRequests picks the nodes (sorted by name) whose upgrade starts
// now. Nodes in an upgrade count against limit. Without byDomain, and for
// nodes in no domain, nodes start one by one in name order while fewer
// than limit are in an upgrade. With byDomain, a domain starts, at its
// first node in name order, while fewer than limit are in an upgrade, and
// then every node of it that needs the upgrade starts together, even
// beyond limit: a domain is never split by the limit. So a domain with a
// node already in an upgrade takes its other nodes that need one at once
// too: those whose request a pass stopped before writing, or that need
// the upgrade since (a driver pod that came back, another requestor's
// maintenance that ended).
func upgradeRequests(nodes []UpgradeNode, limit int, byDomain bool) map[string]bool {
	inFlight := 0
	for _, n := range nodes {
		if n.MaintenanceIsOurs {
			inFlight++
		}
	}
	// started: the domains in an upgrade, with every node that needs one
	// counted in flight from the moment the domain starts.
	started := map[string]bool{}
	waiting := map[string]int{}
	if byDomain {
		for _, n := range nodes {
			switch {
			case n.Domain == "":
			case n.MaintenanceIsOurs:
				started[n.Domain] = true
			case n.needsRequest():
				waiting[n.Domain]++
			}
		}
		for d := range started {
			inFlight += waiting[d]
		}
	}
	requested := map[string]bool{}
	for _, n := range nodes {
		if !n.needsRequest() {
			continue
		}
		if !byDomain || n.Domain == "" {
			if inFlight < limit {
				requested[n.Name] = true
				inFlight++
			}
			continue
		}
		if !started[n.Domain] && inFlight < limit {
			started[n.Domain] = true
			inFlight += waiting[n.Domain]
		}
		if started[n.Domain] {
			requested[n.Name] = true
		}
	}
	return requested
}

// upgradeLimit resolves maxParallelUpgrades and maxUnavailable (of the GPU nodes).
func upgradeLimit(p *nvidiav1.DriverUpgradePolicySpec, gpuNodes int) int {
	limit := 1
	if p != nil && p.MaxParallelUpgrades != nil {
		limit = int(*p.MaxParallelUpgrades)
		if limit == 0 { // no limit of its own, as in the NVIDIA GPU Operator
			limit = gpuNodes
		}
	}
	if p != nil && p.MaxUnavailable != nil {
		if n, err := intstr.GetScaledValueFromIntOrPercent(p.MaxUnavailable, gpuNodes, false); err == nil && n < limit {
			limit = n
		}
	}
	return max(limit, 0)
}

func autoUpgrade(p *nvidiav1.DriverUpgradePolicySpec) bool {
	return p == nil || p.AutoUpgrade == nil || *p.AutoUpgrade
}

// upgradeNodes gathers what the upgrade planner knows about each GPU node
// (pure): its driver pod, whether that runs the desired image and is Ready,
// whether the validator is Ready on it (or not needed: a disabled validator
// is never waited for), our NodeMaintenance of it, and its domain (the
// value of its label domainLabel; "" = no domains). It also returns the
// number of GPU nodes.
func upgradeNodes(spec *nvidiav1.ClusterPolicySpec, nodes *corev1.NodeList, desiredImages map[string]string,
	stackPods []corev1.Pod, ours map[string]*maintenancev1.NodeMaintenance, domainLabel string) (map[string]*UpgradeNode, int) {
	byNode := map[string]*UpgradeNode{}
	gpuNodes := 0
	validatorRuns := ValidatorEnabled(spec)
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !nvidiav1.HasNvidiaGPU(n.Labels) {
			continue
		}
		gpuNodes++
		byNode[n.Name] = &UpgradeNode{Name: n.Name, Failed: n.Labels[nvidiav1.LabelUpgradeState] == upgradeStateFailed,
			ValidatorReady: !validatorRuns}
		if domainLabel != "" {
			byNode[n.Name].Domain = n.Labels[domainLabel]
		}
	}
	for i := range stackPods {
		p := &stackPods[i]
		n := byNode[p.Spec.NodeName]
		if n == nil {
			continue
		}
		if nvidiav1.PodComponent(p.Labels) == Validator {
			if podutils.IsPodReady(p) {
				n.ValidatorReady = true
			}
			continue
		}
		if nvidiav1.PodComponent(p.Labels) != Driver || p.DeletionTimestamp != nil {
			continue
		}
		want, ok := desiredImages[p.Labels["app"]]
		if !ok || len(p.Spec.Containers) == 0 {
			continue
		}
		n.DriverPod, n.DriverPodCreated = p.Name, p.CreationTimestamp.Time
		n.Current = p.Spec.Containers[0].Image == want
		n.Ready = podutils.IsPodReady(p)
		n.ModuleInUse = ModuleInUse(p)
	}
	for node, nm := range ours {
		if n := byNode[node]; n != nil {
			n.Maintenance, n.MaintenanceIsOurs = nm, true
		}
	}
	return byNode, gpuNodes
}

// upgradeDrivers runs one step of the driver rollout. It returns when to
// look again (for upgrade timeouts).
// stackPods are the stack's pods, as listed for the status.
func (r *Reconciler) upgradeDrivers(ctx context.Context, policy *nvidiav1.ClusterPolicy, nodes *corev1.NodeList, desiredImages map[string]string,
	stackPods []corev1.Pod, drivers []nvidiav1alpha1.NVIDIADriver, assign DriverAssignment) (time.Duration, error) {
	if !policy.Spec.Driver.IsEnabled() {
		return 0, nil
	}
	// One rollout per driver: the policy's own, or each NVIDIADriver's with
	// its upgrade policy over its nodes. Nodes of no NVIDIADriver (one
	// that went away mid-upgrade) finish under the policy's.
	policies := map[string]*nvidiav1.DriverUpgradePolicySpec{"": policy.Spec.Driver.UpgradePolicy}
	crdOn := isTrue(policy.Spec.Driver.UseNvidiaDriverCRD)
	if crdOn {
		for i := range drivers {
			policies[drivers[i].Name] = driverUpgradePolicy(policy, &drivers[i])
		}
	}
	ours, err := requestor.Mine(ctx, r.Client, r.Namespace, UpgradeRequestor)
	if err != nil {
		return 0, err
	}
	domainLabel, byDomain, err := r.upgradeDomains(ctx)
	if err != nil {
		return 0, err
	}
	byNode, _ := upgradeNodes(&policy.Spec, nodes, desiredImages, stackPods, ours, domainLabel)
	if err := r.readReboots(ctx, byNode); err != nil {
		return 0, err
	}
	groups := map[string][]UpgradeNode{}
	for _, n := range byNode {
		g := ""
		if crdOn {
			if _, ok := policies[assign.Node[n.Name]]; ok {
				g = assign.Node[n.Name]
			}
		}
		groups[g] = append(groups[g], *n)
	}
	now := r.Clock.Now()
	timeout := r.UpgradeTimeout
	if timeout == 0 {
		timeout = defaultUpgradeTimeout
	}
	var requeue time.Duration
	for g, list := range groups {
		up := policies[g]
		if !autoUpgrade(up) {
			continue
		}
		for _, a := range PlanUpgrades(list, upgradeLimit(up, len(list)), byDomain, timeout, now) {
			if err := r.act(ctx, policy, up, a, byNode[a.Node], now); err != nil {
				return 0, err
			}
		}
	}
	for _, n := range byNode {
		if n.MaintenanceIsOurs && n.Maintenance.IsReady() && !n.Ready {
			requeue = minPositive(requeue, timeout)
		}
	}
	return requeue, nil
}

// upgradeDomains reads the domains of the maintenance config "default" in
// the namespace of the upgrades' NodeMaintenance objects (from the cache):
// the node label naming a node's domain ("" = no domains), and whether
// upgrades go by domain. Without that config, or without its API (NVIDIA's
// Maintenance Operator's older CRD, say), there are no domains.
func (r *Reconciler) upgradeDomains(ctx context.Context) (label string, byDomain bool, err error) {
	cfg := &maintenancev1.MaintenanceOperatorConfig{}
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: maintenancev1.DefaultConfigName}, cfg)
	switch {
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("reading MaintenanceOperatorConfig %s/%s for the upgrades' domains: %w", r.Namespace, maintenancev1.DefaultConfigName, err)
	}
	label, byDomain = upgradeDomainsOf(cfg)
	return label, byDomain, nil
}

// upgradeDomainsOf is what driver upgrades read of a maintenance config:
// its domain label ("" = no domains) and upgradeByDomain.
func upgradeDomainsOf(cfg *maintenancev1.MaintenanceOperatorConfig) (label string, byDomain bool) {
	if d := cfg.Spec.Domains; d != nil {
		return d.NodeLabel, d.UpgradeByDomain
	}
	return "", false
}

// readReboots adds the reboots that the nodes' upgrades asked for. It reads
// NodeRepairs only while an upgrade holds a node, and an API server without
// them (the repair CRDs not installed) means no reboot was asked for.
func (r *Reconciler) readReboots(ctx context.Context, byNode map[string]*UpgradeNode) error {
	var list *repairv1.NodeRepairList
	for _, n := range byNode {
		if !n.MaintenanceIsOurs {
			continue
		}
		if list == nil {
			list = &repairv1.NodeRepairList{}
			if err := r.Client.List(ctx, list, client.HasLabels{LabelRebootOf}); err != nil {
				if meta.IsNoMatchError(err) {
					return nil
				}
				return fmt.Errorf("listing the reboots of driver upgrades: %w", err)
			}
		}
		name := rebootName(n.Maintenance)
		for i := range list.Items {
			if nr := &list.Items[i]; nr.Name == name {
				b := &UpgradeReboot{Name: nr.Name, Phase: nr.Status.Phase, Message: nr.Status.Message, Created: nr.CreationTimestamp.Time}
				if t := nr.Status.Timeline; len(t) > 0 && b.done() {
					b.Ended = t[len(t)-1].Time.Time
				}
				n.Reboot = b
			}
		}
	}
	return nil
}

// rebootName names the reboot of one upgrade attempt (one NodeMaintenance):
// a later upgrade of the node may ask for its own.
func rebootName(nm *maintenancev1.NodeMaintenance) string {
	uid := string(nm.UID)
	if len(uid) > 8 {
		uid = uid[:8]
	}
	return "driver-reboot-" + nm.Spec.NodeName + "-" + uid
}

// moduleInUse matches what the NVIDIA driver container and the
// k8s-driver-manager print when the loaded kernel module cannot be
// unloaded (a process on the host still holds the GPUs).
var moduleInUse = regexp.MustCompile(`(?i)(could not unload nvidia driver kernel modules[^\n]{0,100}|module nvidia\S{0,40} is in use|failed to unload kernel module nvidia\S{0,40}[^\n]{0,100})`)

// ModuleInUse returns the line of a driver pod's container status saying
// that the old kernel module is still in use ("" if none): the container's
// termination message (the driver DaemonSet keeps the log's tail there) or
// its waiting message, current or from its last run.
func ModuleInUse(p *corev1.Pod) string {
	if name, line := moduleInUseStatus(p); line != "" {
		return name + ": " + line
	}
	return ""
}

// moduleInUseStatus returns the container and the line of ModuleInUse.
func moduleInUseStatus(p *corev1.Pod) (container, line string) {
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			for _, st := range []corev1.ContainerState{cs.State, cs.LastTerminationState} {
				var msg string
				switch {
				case st.Terminated != nil:
					msg = st.Terminated.Message
				case st.Waiting != nil:
					msg = st.Waiting.Message
				}
				if m := moduleInUse.FindString(msg); m != "" {
					return cs.Name, strings.TrimSpace(m)
				}
			}
		}
	}
	return "", ""
}

func (r *Reconciler) act(ctx context.Context, policy *nvidiav1.ClusterPolicy, up *nvidiav1.DriverUpgradePolicySpec, a UpgradeAction, n *UpgradeNode, now time.Time) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.Node}}
	switch a.Kind {
	case ActRequest:
		if _, err := requestor.Ensure(ctx, r.Client, upgradeRequest(policy, up, r.Namespace, a.Node)); err != nil {
			return fmt.Errorf("driver upgrade of %s: %w", a.Node, err)
		}
		r.Recorder.Eventf(policy, node, corev1.EventTypeNormal, ReasonUpgradeStarted, actionUpgrade, "Driver upgrade of node %s requested", a.Node)
		return r.setUpgradeLabel(ctx, a.Node, upgradeStateUpgrading)
	case ActRestartDriver:
		// Record first: a crash after the delete must not restart the new
		// pod; a crash before it is seen from the old pod's age (the
		// planner deletes it again, keeping the first restart's time).
		if n.Maintenance.Annotations[annotationRestartedAt] == "" {
			nm := n.Maintenance.DeepCopy()
			patch := client.MergeFrom(n.Maintenance)
			if nm.Annotations == nil {
				nm.Annotations = map[string]string{}
			}
			nm.Annotations[annotationRestartedAt] = now.UTC().Format(time.RFC3339)
			if err := r.Client.Patch(ctx, nm, patch); err != nil {
				return fmt.Errorf("recording the driver restart on %s: %w", a.Node, err)
			}
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: n.DriverPod}}
		if err := r.Client.Delete(ctx, pod); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting the old driver pod on %s: %w", a.Node, err)
		}
		return nil
	case ActDrainNode:
		nm := n.Maintenance.DeepCopy()
		patch := client.MergeFromWithOptions(n.Maintenance, client.MergeFromWithOptimisticLock{})
		nm.Spec.DrainSpec = rebootDrain(nm.Spec.DrainSpec)
		if err := r.Client.Patch(ctx, nm, patch); err != nil {
			return fmt.Errorf("widening the drain of %s for its reboot: %w", a.Node, err)
		}
		r.Recorder.Eventf(policy, node, corev1.EventTypeNormal, ReasonModuleInUse, actionUpgrade,
			"New driver on node %s cannot load (%s): draining the whole node (NodeMaintenance %s/%s) before its reboot",
			a.Node, n.ModuleInUse, nm.Namespace, nm.Name)
		return nil
	case ActReboot:
		return r.askReboot(ctx, policy, n, now)
	case ActFinish:
		if err := requestor.Release(ctx, r.Client, n.Maintenance.Namespace, n.Maintenance.Name); err != nil {
			return fmt.Errorf("driver upgrade of %s done: %w", a.Node, err)
		}
		how := ""
		if n.Reboot != nil {
			how = " (after a reboot freed the old kernel module)"
		}
		r.Recorder.Eventf(policy, node, corev1.EventTypeNormal, ReasonUpgradeDone, actionUpgrade, "Driver of node %s upgraded%s", a.Node, how)
		return r.setUpgradeLabel(ctx, a.Node, "")
	case ActFail:
		why := "New driver on node %s not Ready in time"
		switch b := n.Reboot; {
		case !n.Maintenance.IsReady() && n.Maintenance.DrainTimedOut() && !DrainsForReboot(n.Maintenance.Spec.DrainSpec):
			_, held := n.Maintenance.DrainHeld()
			why = "GPU pods of node %s not drained within the drain's timeout, driver not restarted under them (" + strings.ReplaceAll(held, "%", "%%") + ")"
		case b == nil:
		case b.Phase == repairv1.PhaseSucceeded:
			why = "New driver on node %s not Ready in time after the reboot"
		case b.Phase == "":
			why = "Reboot of node %s (NodeRepair " + b.Name + ") never started: is gpufleet's repair capability running?"
		default:
			why = "Reboot of node %s (NodeRepair " + b.Name + ") failed: " + strings.ReplaceAll(b.Message, "%", "%%")
		}
		r.Recorder.Eventf(policy, node, corev1.EventTypeWarning, ReasonUpgradeFailed, actionUpgrade,
			why+"; node marked %s=%s and released so the rollout continues", a.Node, nvidiav1.LabelUpgradeState, upgradeStateFailed)
		if err := r.setUpgradeLabel(ctx, a.Node, upgradeStateFailed); err != nil {
			return err
		}
		if err := requestor.Release(ctx, r.Client, n.Maintenance.Namespace, n.Maintenance.Name); err != nil {
			return fmt.Errorf("driver upgrade of %s failed: %w", a.Node, err)
		}
		return nil
	case ActClearFailed:
		return r.setUpgradeLabel(ctx, a.Node, "")
	}
	return nil
}

// askReboot asks the repair engine to reboot a node whose new driver cannot
// load while the old kernel module is in use: a NodeRepair that reboots
// inside the upgrade's NodeMaintenance (the node stays cordoned, the
// cluster's limits already count it), created complete so that nothing
// can start it half-written.
func (r *Reconciler) askReboot(ctx context.Context, policy *nvidiav1.ClusterPolicy, n *UpgradeNode, now time.Time) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
	nr := &repairv1.NodeRepair{
		ObjectMeta: metav1.ObjectMeta{Name: rebootName(n.Maintenance),
			Labels: map[string]string{LabelManagedBy: managedBy, LabelComponent: Driver, LabelRebootOf: n.Name}},
		Spec: repairv1.NodeRepairSpec{
			NodeName: n.Name, Requestor: UpgradeRequestor, Maintenance: n.Maintenance.Name,
			Actions: []repairv1.Action{repairv1.ActionReboot},
			Fault: repairv1.Fault{Rule: RuleModuleInUse, ConditionType: "DriverUpgrade", Status: "True",
				Reason: "KernelModuleInUse", Message: n.ModuleInUse, Since: metav1.NewTime(now)},
		},
	}
	if err := controllerutil.SetControllerReference(policy, nr, r.Client.Scheme()); err != nil {
		return err
	}
	if err := r.Client.Create(ctx, nr); err != nil && !apierrors.IsAlreadyExists(err) {
		if meta.IsNoMatchError(err) {
			r.Recorder.Eventf(policy, node, corev1.EventTypeWarning, ReasonModuleInUse, actionUpgrade,
				"New driver on node %s cannot load (%s) and this cluster has no NodeRepair API to reboot it: reboot the node by hand", n.Name, n.ModuleInUse)
			return nil
		}
		return fmt.Errorf("asking for a reboot of %s: %w", n.Name, err)
	}
	r.Recorder.Eventf(policy, node, corev1.EventTypeWarning, ReasonModuleInUse, actionUpgrade,
		"New driver on node %s cannot load: %s; rebooting the node (NodeRepair %s) inside NodeMaintenance %s/%s",
		n.Name, n.ModuleInUse, nr.Name, n.Maintenance.Namespace, n.Maintenance.Name)
	return r.setUpgradeLabel(ctx, n.Name, upgradeStateRebooting)
}

// GPUPodFilters select the pods a driver restart affects: those requesting
// an nvidia.com/ resource (the device plugin's), and those with a
// ResourceClaim allocated by NVIDIA's DRA driver.
func GPUPodFilters() []maintenancev1.PodEvictionFilterEntry {
	return []maintenancev1.PodEvictionFilterEntry{
		{ByResourceNameRegex: ptr.To(`^nvidia\.com/`)},
		{ByDRADriverRegex: ptr.To(`^` + regexp.QuoteMeta(nvidiav1.DRADriver) + `$`)},
	}
}

func (r *Reconciler) setUpgradeLabel(ctx context.Context, node, value string) error {
	var v any = value
	if value == "" {
		v = nil
	}
	return r.patchNodeLabels(ctx, node, map[string]any{nvidiav1.LabelUpgradeState: v})
}

// upgradeRequest is the maintenance request of one node's driver upgrade,
// with the NVIDIA GPU Operator's meaning of upgradePolicy: cordon; wait for
// the pods of waitForCompletion.podSelector (if set); then delete the pods
// that use GPUs (podDeletion: force, timeout, emptyDir; default force and
// emptyDir, 300 s) — or, with drain.enable, drain the node's pods (those of
// drain.podSelector) with the drain settings instead.
func upgradeRequest(policy *nvidiav1.ClusterPolicy, up *nvidiav1.DriverUpgradePolicySpec, ns, node string) requestor.Request {
	drain := &maintenancev1.DrainSpec{
		Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](300),
		PodEvictionFilters: GPUPodFilters(),
	}
	var wait *maintenancev1.WaitForPodCompletionSpec
	if up != nil {
		if d := up.PodDeletion; d != nil {
			drain.Force, drain.DeleteEmptyDir = d.Force, d.DeleteEmptyDir
			if d.TimeoutSeconds != nil {
				drain.TimeoutSeconds = d.TimeoutSeconds
			}
		}
		if d := up.Drain; d != nil && d.Enable != nil && *d.Enable {
			drain = &maintenancev1.DrainSpec{Force: d.Force, DeleteEmptyDir: d.DeleteEmptyDir,
				PodSelector: maintenancev1.LabelSelectorString(d.PodSelector), TimeoutSeconds: ptr.To[int32](300)}
			if d.TimeoutSeconds != nil {
				drain.TimeoutSeconds = d.TimeoutSeconds
			}
		}
		if w := up.WaitForCompletion; w != nil && w.PodSelector != "" {
			wait = &maintenancev1.WaitForPodCompletionSpec{PodSelector: maintenancev1.LabelSelectorString(w.PodSelector), TimeoutSeconds: w.TimeoutSeconds}
		}
	}
	return requestor.Request{
		RequestorID: UpgradeRequestor, Namespace: ns, Name: "driver-upgrade-" + node, NodeName: node, Owner: policy,
		Labels: map[string]string{LabelManagedBy: managedBy, LabelComponent: Driver},
		Cordon: ptr.To(true), Drain: drain, WaitForPodCompletion: wait,
	}
}
