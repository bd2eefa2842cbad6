package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Action is one thing the node agent can do. The set is fixed: the API
// never carries an arbitrary command.
// +kubebuilder:validation:Enum=RestartKubelet;RestartContainerRuntime;RestartNTP;DeleteBrokenSandbox;ResetGPU;Reboot;ValidateGPU;RestartFabricManager;RestartPersistenced;RestartDCGM;RestartGPUStackPods
type Action string

// Actions.
const (
	ActionRestartKubelet          Action = "RestartKubelet"
	ActionRestartContainerRuntime Action = "RestartContainerRuntime"
	ActionRestartNTP              Action = "RestartNTP"
	ActionDeleteBrokenSandbox     Action = "DeleteBrokenSandbox"
	// ActionResetGPU resets the repair's faulty GPUs (spec.gpus), after the
	// pods using them were drained through NodeMaintenance (the node is not
	// cordoned; the GPUs are isolated).
	ActionResetGPU Action = "ResetGPU"
	// ActionReboot runs only when the policy allows reboots, after a cordon
	// and drain through NodeMaintenance.
	ActionReboot Action = "Reboot"
	// ActionValidateGPU proves that the repair's GPUs work (the policy's
	// gpu.validation level) before they return to service; the repair asks
	// for it after a successful ResetGPU or reboot. It is not a rung of the
	// ladder: a rule need not list it.
	ActionValidateGPU Action = "ValidateGPU"
	// ActionRestartFabricManager restarts NVIDIA Fabric Manager (systemd
	// unit nvidia-fabricmanager) on the node.
	ActionRestartFabricManager Action = "RestartFabricManager"
	// ActionRestartPersistenced restarts the NVIDIA persistence daemon
	// (nvidia-persistenced).
	ActionRestartPersistenced Action = "RestartPersistenced"
	// ActionRestartDCGM restarts the DCGM host engine (nvidia-dcgm).
	ActionRestartDCGM Action = "RestartDCGM"
	// ActionRestartGPUStackPods deletes the node's pods of the GPU stack
	// that report GPU health to the kubelet and the scheduler — the device
	// plugin and the DRA kubelet plugin (the policy's gpu.stackPods) — so
	// that their DaemonSets start them again: both keep a GPU they once
	// found unhealthy out of service until they restart. gpufleet runs it
	// itself, not the node agent; running pods keep their GPUs.
	ActionRestartGPUStackPods Action = "RestartGPUStackPods"
)

// AgentRuns reports whether the node agent runs the action (all but
// RestartGPUStackPods, which the repair controller runs).
func (a Action) AgentRuns() bool { return a != ActionRestartGPUStackPods }

// Known reports whether a is one of the fixed set of actions (the
// schema's enumeration).
func (a Action) Known() bool {
	switch a {
	case ActionRestartKubelet, ActionRestartContainerRuntime, ActionRestartNTP, ActionDeleteBrokenSandbox, ActionResetGPU,
		ActionReboot, ActionValidateGPU, ActionRestartFabricManager, ActionRestartPersistenced, ActionRestartDCGM, ActionRestartGPUStackPods:
		return true
	}
	return false
}

// Outcomes of a timeline entry of an agent action, as the node agent
// writes them and the repair controller reads them.
const (
	OutcomeRequested   = "Requested"
	OutcomeStarted     = "Started"
	OutcomeSucceeded   = "Succeeded"
	OutcomeFailed      = "Failed"
	OutcomeInterrupted = "Interrupted"
	// OutcomeRefused: the agent refused a disruptive action (no
	// NodeMaintenance held its node).
	OutcomeRefused = "Refused"
)

// LastEntry is the timeline's last entry (nil: none).
func (nr *NodeRepair) LastEntry() *TimelineEntry {
	if n := len(nr.Status.Timeline); n > 0 {
		return &nr.Status.Timeline[n-1]
	}
	return nil
}

// Validates reports whether the repair's GPUs must pass a validation
// before they return to service: a GPU repair whose validation is not Off
// (the default level is Health).
func (nr *NodeRepair) Validates() bool {
	return len(nr.Spec.GPUs) > 0 && nr.Spec.Validation.LevelOf() != GPUValidationOff
}

// LabelIsolates on a DeviceTaintRule of gpufleet's names the GPUFault it
// isolates (gpufleet uninstall reports the rules it leaves).
const LabelIsolates = "repair.gpufleet.dev/isolates"

// RequestorID is the requestor of the NodeMaintenance objects a repair
// holds its node with (the node agent runs a reboot or a GPU reset only
// inside one of them).
const RequestorID = "repair.gpufleet.dev"

// Risk of a fault.
// +kubebuilder:validation:Enum=high;medium;low
type Risk string

// Rule says which node condition is a fault and how to repair it.
type Rule struct {
	// Name identifies the rule (in events and NodeRepair objects).
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// ConditionType of the node condition, e.g. Ready, ReadonlyFilesystem.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	ConditionType string `json:"conditionType"`
	// Status that makes it a fault.
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status string `json:"status"`
	// Reason, if set, must equal the condition's reason (letter case
	// does not matter).
	// +optional
	Reason string `json:"reason,omitempty"`
	// MessageContains, if set, must be a substring of the condition's
	// message (letter case does not matter).
	// +optional
	MessageContains string `json:"messageContains,omitempty"`
	// ThresholdSeconds: the fault counts once it has persisted this long,
	// measured by gpufleet's own clock.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	ThresholdSeconds int32 `json:"thresholdSeconds"`
	// Actions in order; Reboot, if present, must be the last and only
	// Reboot (it ends the ladder). No actions: the fault is reported
	// (RecoveryFailed, with the condition's message) and nothing runs.
	// +optional
	// +kubebuilder:validation:MaxItems=5
	// +kubebuilder:validation:XValidation:rule="self.all(a, a != 'Reboot') || (self[size(self)-1] == 'Reboot' && self.filter(a, a == 'Reboot').size() == 1)",message="Reboot may appear once, as the last action"
	Actions []Action `json:"actions,omitempty"`
	// +optional
	Risk Risk `json:"risk,omitempty"`
}

// DrainSpec of a repair's drains: the whole node's before a reboot, and
// the pods of a faulty GPU before its reset.
type DrainSpec struct {
	// TimeoutSeconds; unset: max(600, the largest terminationGracePeriodSeconds
	// of the node's pods), at most 1800. Only a drain past its timeout lets
	// the repair go on without it; a drain refused at once (a pod it may
	// not evict) holds the repair, and says why, until then.
	// +optional
	// +kubebuilder:validation:Minimum=1
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
	// Force evicts pods without a controller. Default true: a reboot ends
	// such a pod anyway, and an eviction at least gives it its grace
	// period and honours its PodDisruptionBudget. False: the drain refuses
	// such a pod and the repair waits, saying so, until the drain timeout.
	// +optional
	// +kubebuilder:default=true
	Force *bool `json:"force,omitempty"`
	// DeleteEmptyDir evicts pods with emptyDir volumes (every PyTorch pod
	// with a /dev/shm emptyDir). Default true: a reboot loses that data
	// anyway. False: as for force.
	// +optional
	// +kubebuilder:default=true
	DeleteEmptyDir *bool `json:"deleteEmptyDir,omitempty"`
}

// NodeRepairPolicySpec configures auto-repair.
type NodeRepairPolicySpec struct {
	// NodeSelector chooses the nodes (empty: all).
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// PoolLabel groups nodes into pools; repairs run one pool at a time.
	// +optional
	// +kubebuilder:default="gpufleet.dev/pool"
	PoolLabel string `json:"poolLabel,omitempty"`
	// Rules; empty: the defaults (see the documentation).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Rules []Rule `json:"rules,omitempty"`
	// AllowReboot lets repairs cordon, drain and reboot a node.
	// +optional
	AllowReboot bool `json:"allowReboot,omitempty"`
	// +optional
	Drain DrainSpec `json:"drain,omitempty"`
	// MaxUnhealthy: when more nodes of a pool are faulty at once (an int or
	// a percentage of the pool), no repair starts there (storm protection).
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnhealthy must be a non-negative integer or a percentage between 0% and 100%"
	MaxUnhealthy *intstr.IntOrString `json:"maxUnhealthy,omitempty"`
	// MaxParallelPools: pools repairing at the same time. Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	MaxParallelPools *int32 `json:"maxParallelPools,omitempty"`
	// VerificationSeconds: after component actions, how long the fault may
	// take to clear before the next rung of the ladder. Default 60.
	// +optional
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=1
	VerificationSeconds *int32 `json:"verificationSeconds,omitempty"`
	// ActionTimeoutSeconds bounds how long the node agent may take to run
	// one component action (from the request to its recorded outcome); past
	// it the repair fails (RecoveryFailed) — e.g. no agent runs on the node.
	// Default 600.
	// +optional
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=86400
	ActionTimeoutSeconds *int32 `json:"actionTimeoutSeconds,omitempty"`
	// RebootTimeoutSeconds bounds a reboot: from the request until the node
	// reports a new boot ID and Ready. Past it the repair fails
	// (RecoveryFailed, pool suspended) and the node is released instead of
	// being held cordoned. Default 1200.
	// +optional
	// +kubebuilder:default=1200
	// +kubebuilder:validation:Minimum=60
	// +kubebuilder:validation:Maximum=86400
	RebootTimeoutSeconds *int32 `json:"rebootTimeoutSeconds,omitempty"`
	// MaintenanceTimeoutSeconds bounds how long a repair waits for its
	// NodeMaintenance to be scheduled and to hold the node (the cluster's
	// maintenance limits and windows, the cordon), on top of the drain's
	// own timeout; past it the repair ends RecoveryFailed, releases the
	// request and says what it waited for. Default 3600.
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=60
	// +kubebuilder:validation:Maximum=604800
	MaintenanceTimeoutSeconds *int32 `json:"maintenanceTimeoutSeconds,omitempty"`
	// RepairAfter bounds the repairs of a fault that keeps coming back: a
	// node condition fault that occurs for the count-th time within the
	// window on the same node (by rule) is not repaired again; its repair
	// ends RecoveryFailed with a recommendation to replace or investigate
	// the node, shown on the node, until the fault clears. Default 3
	// within 24 h. (GPU faults have gpu.replaceAfter, per GPU.)
	// +optional
	RepairAfter *RepeatLimit `json:"repairAfter,omitempty"`
	// HistoryLimit is how many finished NodeRepairs are kept per node (the
	// newest; the fleet view shows them): older ones are deleted. A repair
	// in progress, and a failed one whose fault has not cleared, are never
	// deleted; nor are the repairs RepairAfter still counts. Default 10.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	HistoryLimit *int32 `json:"historyLimit,omitempty"`
	// Paused stops new repairs (running ones finish).
	// +optional
	Paused bool `json:"paused,omitempty"`
	// DryRun records and reports what would be repaired; no action runs
	// and no GPU is isolated.
	// +optional
	DryRun bool `json:"dryRun,omitempty"`
	// GPU configures the handling of GPU faults (the GPUProblem condition
	// and GPUFault records of the node agent).
	// +optional
	GPU GPUSpec `json:"gpu,omitempty"`
}

// SelectsLabels reports whether the policy selects a node with these
// labels (no nodeSelector: every node; an unusable selector: none — the
// detector reports it on the policy).
func (p *NodeRepairPolicy) SelectsLabels(nodeLabels map[string]string) bool {
	if p.Spec.NodeSelector == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
	return err == nil && sel.Matches(labels.Set(nodeLabels))
}

// SuspendedPool is a pool where repairs stopped.
type SuspendedPool struct {
	Pool string `json:"pool"`
	// Node whose repair failed.
	Node string `json:"node"`
	// +optional
	Reason string `json:"reason,omitempty"`
}

// NodeRepairPolicyStatus is the observed state.
type NodeRepairPolicyStatus struct {
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// SuspendedPools lists pools held back by a failed repair until its
	// fault clears (or an administrator removes the entry).
	// +optional
	// +listType=map
	// +listMapKey=pool
	SuspendedPools []SuspendedPool `json:"suspendedPools,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// NodeRepairPolicy decides which node faults gpufleet repairs and how.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nrp
// +kubebuilder:printcolumn:name="Reboot",type="boolean",JSONPath=`.spec.allowReboot`
// +kubebuilder:printcolumn:name="Paused",type="boolean",JSONPath=`.spec.paused`
// +kubebuilder:printcolumn:name="DryRun",type="boolean",JSONPath=`.spec.dryRun`
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type NodeRepairPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeRepairPolicySpec   `json:"spec,omitempty"`
	Status NodeRepairPolicyStatus `json:"status,omitempty"`
}

// NodeRepairPolicyList is a list of NodeRepairPolicy.
//
// +kubebuilder:object:root=true
type NodeRepairPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeRepairPolicy `json:"items"`
}

// Phase of a NodeRepair.
// +kubebuilder:validation:Enum=Repairing;Succeeded;RecoveryFailed;Ignored
type Phase string

// Phases.
const (
	PhaseRepairing      Phase = "Repairing"
	PhaseSucceeded      Phase = "Succeeded"
	PhaseRecoveryFailed Phase = "RecoveryFailed"
	PhaseIgnored        Phase = "Ignored"
)

// Fault is the condition that triggered a repair.
type Fault struct {
	Rule          string `json:"rule"`
	ConditionType string `json:"conditionType"`
	Status        string `json:"status"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// Since is when gpufleet first saw the fault.
	Since metav1.Time `json:"since"`
}

// NodeRepairSpec is one repair.
//
// +kubebuilder:validation:XValidation:rule="(has(self.policy) && size(self.policy) > 0) != (has(self.requestor) && size(self.requestor) > 0)",message="a NodeRepair has either a policy (found by a NodeRepairPolicy) or a requestor (asked for by a gpufleet controller)"
// +kubebuilder:validation:XValidation:rule="!has(self.requestor) || size(self.requestor) == 0 || (has(self.maintenance) && size(self.maintenance) > 0 && has(self.actions) && self.actions == ['Reboot'])",message="a requested repair names the requestor's NodeMaintenance (maintenance) and has actions [Reboot]"
type NodeRepairSpec struct {
	// NodeName is the node being repaired.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nodeName is immutable"
	NodeName string `json:"nodeName"`
	// +optional
	Pool string `json:"pool,omitempty"`
	// Policy that started it; empty for a repair another gpufleet
	// controller requested (requestor).
	// +optional
	Policy string `json:"policy,omitempty"`
	// Requestor, when set, is the gpufleet controller that asked for this
	// repair instead of a NodeRepairPolicy (e.g. a driver upgrade whose new
	// driver cannot load while the old kernel module is in use). Such a
	// repair reboots the node inside the requestor's own NodeMaintenance
	// (maintenance), which already holds the node, and leaves releasing it
	// to the requestor.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Requestor string `json:"requestor,omitempty"`
	// Maintenance is the requestor's NodeMaintenance (in gpufleet's
	// namespace) that holds the node; the reboot waits until it is Ready.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Maintenance string `json:"maintenance,omitempty"`
	Fault       Fault  `json:"fault"`
	// Actions to run, in order (Reboot only when allowed); empty when the
	// only remedy is a reboot the policy does not allow.
	// +optional
	Actions []Action `json:"actions,omitempty"`
	// DryRun: the record of a fault that a dry run found; nothing runs.
	// +optional
	DryRun bool `json:"dryRun,omitempty"`
	// IgnoreReason, when set, says why the detector decided not to repair
	// this fault (the node is being deleted, or held by another requestor's
	// maintenance). The record is complete when created: the repair
	// controller never acts on it.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	IgnoreReason string `json:"ignoreReason,omitempty"`
	// GPUs the repair is about (GPU faults only): ResetGPU resets them and
	// drains only the pods using them; the repair succeeds when all of
	// them are back in service.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	GPUs []GPURef `json:"gpus,omitempty"`
	// Recommendation, when set, is what a person has to do (e.g. replace a
	// GPU that faulted too often); nothing runs and the repair ends
	// RecoveryFailed with it, shown on the node.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Recommendation string `json:"recommendation,omitempty"`
	// Escalation, when set, says why the repair takes the whole node rather
	// than resetting its GPUs one by one (too many GPUs of a device-plugin
	// node out of service, gpu.wholeNodeAfter).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Escalation string `json:"escalation,omitempty"`
	// Validation is the policy's gpu.validation when the repair was
	// created (GPU repairs): the node agent validates the GPUs at that
	// level, and returns them to service only when they pass.
	// +optional
	Validation *GPUValidation `json:"validation,omitempty"`
}

// Requested reports whether another gpufleet controller asked for the
// repair (a reboot inside its own NodeMaintenance), not a NodeRepairPolicy.
func (nr *NodeRepair) Requested() bool {
	return nr.Spec.Requestor != ""
}

// Recorded reports whether the NodeRepair only records a fault (dry run, or
// ignored) and is never acted on.
func (nr *NodeRepair) Recorded() bool {
	return nr.Spec.DryRun || nr.Spec.IgnoreReason != ""
}

// TimelineEntry is one thing that happened during a repair.
type TimelineEntry struct {
	Time metav1.Time `json:"time"`
	// Step: Start, Isolate, an Action, Verify, Maintenance, Done.
	Step string `json:"step"`
	// Outcome: Requested, Succeeded, Failed, Skipped, ...
	Outcome string `json:"outcome"`
	// +optional
	Message string `json:"message,omitempty"`
}

// PendingAction is an action waiting for the node agent.
type PendingAction struct {
	Action      Action      `json:"action"`
	RequestedAt metav1.Time `json:"requestedAt"`
}

// NodeRepairStatus records the repair's progress; the controller and the
// agent resume from it after a restart.
type NodeRepairStatus struct {
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// NextAction indexes spec.actions (len(spec.actions) once every rung
	// ran).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	NextAction int32 `json:"nextAction,omitempty"`
	// Pending is the action the agent has to run now.
	// +optional
	Pending *PendingAction `json:"pending,omitempty"`
	// VerifyUntil is the end of the current verification window.
	// +optional
	VerifyUntil *metav1.Time `json:"verifyUntil,omitempty"`
	// BootIDBefore is the node's boot ID when the reboot was requested.
	// +optional
	BootIDBefore string `json:"bootIDBefore,omitempty"`
	// RebootRequestedAt is when the reboot was requested (its timeout
	// counts from here).
	// +optional
	RebootRequestedAt *metav1.Time `json:"rebootRequestedAt,omitempty"`
	// MaintenanceName is the NodeMaintenance holding the node for a reboot.
	// +optional
	MaintenanceName string `json:"maintenanceName,omitempty"`
	// MaintenanceRequestedAt is when the repair's current NodeMaintenance
	// (the GPU drain's or the reboot's) was requested: the wait for it to
	// hold the node is bounded from there (maintenanceTimeoutSeconds).
	// +optional
	MaintenanceRequestedAt *metav1.Time `json:"maintenanceRequestedAt,omitempty"`
	// HeldForReplacement names the NodeMaintenance the failed repair keeps,
	// so that its node stays cordoned: a GPU that failed after a reboot
	// and that no DeviceTaintRule isolates would be given out again by the
	// device plugin. A person deletes it (or the NodeRepair) once the GPU
	// is replaced.
	// +optional
	HeldForReplacement string `json:"heldForReplacement,omitempty"`
	// GPUMaintenanceName is the NodeMaintenance that drains only the pods
	// using spec.gpus before ResetGPU (the node is not cordoned).
	// +optional
	GPUMaintenanceName string `json:"gpuMaintenanceName,omitempty"`
	// +optional
	Timeline []TimelineEntry `json:"timeline,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// NodeRepair is one repair of one node, with its timeline.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nr
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Node",type="string",JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Pool",type="string",JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Fault",type="string",JSONPath=`.spec.fault.rule`
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Message",type="string",JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type NodeRepair struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeRepairSpec   `json:"spec,omitempty"`
	Status NodeRepairStatus `json:"status,omitempty"`
}

// NodeRepairList is a list of NodeRepair.
//
// +kubebuilder:object:root=true
type NodeRepairList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeRepair `json:"items"`
}

func init() {
	register(&NodeRepairPolicy{}, &NodeRepairPolicyList{}, &NodeRepair{}, &NodeRepairList{})
}
