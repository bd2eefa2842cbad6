package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of a NodeMaintenance.
const (
	// ConditionTypeReady carries the phase as its reason; True only in phase Ready.
	ConditionTypeReady = "Ready"
	// ConditionTypeRequestorFailed is set by a requestor to report that its
	// maintenance failed; the object then stays in phase RequestorFailed.
	ConditionTypeRequestorFailed = "RequestorFailed"
	// ConditionTypeDrainBlocked (gpufleet) says why a drain does not finish:
	// reason DrainFailed while kubectl's drain rules refuse it (a selected
	// pod without a controller and no force, local storage and no
	// deleteEmptyDir), reason DrainBlocked once it is past its
	// timeoutSeconds with pods still on the node. Only the second is a
	// timeout: a requestor that goes on without a finished drain does so
	// only then (DrainTimedOut).
	ConditionTypeDrainBlocked = "DrainBlocked"
	// ConditionTypeInvalidSpec (gpufleet) reports a spec that passed the
	// schema but cannot be acted on (e.g. an eviction filter regex that does
	// not compile); nothing is evicted while it is True.
	ConditionTypeInvalidSpec = "InvalidSpec"
	// ConditionTypeRetained (gpufleet) says why an object Ready for longer
	// than maxNodeMaintenanceTimeSeconds is not garbage-collected: its
	// requestor is one of gpufleet's own (a repair, a driver upgrade), which
	// end their objects within their own bounds.
	ConditionTypeRetained = "Retained"
)

// Reasons of the DrainBlocked condition.
const (
	// DrainBlockedReasonRefused: kubectl's drain rules refuse a pod the
	// drain selected; nothing is evicted until the spec or the pods change.
	DrainBlockedReasonRefused = "DrainFailed"
	// DrainBlockedReasonTimedOut: the drain is past its timeoutSeconds
	// with pods still on the node (refused, or their evictions not yet
	// granted); it keeps retrying.
	DrainBlockedReasonTimedOut = "DrainBlocked"
)

// Phase is a NodeMaintenance phase, carried as the Ready condition's reason.
type Phase string

// Phases, in lifecycle order.
const (
	PhasePending              Phase = "Pending"
	PhaseScheduled            Phase = "Scheduled"
	PhaseCordon               Phase = "Cordon"
	PhaseWaitForPodCompletion Phase = "WaitForPodCompletion"
	PhaseDraining             Phase = "Draining"
	PhaseReady                Phase = "Ready"
	PhaseRequestorFailed      Phase = "RequestorFailed"
)

// AnnotationUrgent (gpufleet), set to "true" on a NodeMaintenance, marks it
// urgent: it may start outside the maintenance windows of the
// MaintenanceOperatorConfig when its node is already unavailable (or
// whenever the config's urgentMaintenance is AllNodes). Limits still apply.
const AnnotationUrgent = "maintenance.gpufleet.dev/urgent"

// Finalizer guarantees cleanup (uncordon) before a NodeMaintenance goes away.
const Finalizer = "maintenance.nvidia.com/finalizer"

// Annotations of NVIDIA's Maintenance Operator on a NodeMaintenance, byte
// for byte: gpufleet reads them on objects it takes over from that
// operator, and writes the ones that operator reads, so that a switch in
// either direction continues each object where it is.
const (
	// AnnotationNodeInitialUnschedulable records, before the cordon,
	// whether the node was already unschedulable ("true"/"false"); only a
	// node recorded "false" is uncordoned when the object goes away.
	AnnotationNodeInitialUnschedulable = "maintenance.nvidia.com/node-initial-state.unschedulable"
	// AnnotationWaitPodCompletionStart is when waiting for pod completion
	// began (RFC 3339); waitForPodCompletion.timeoutSeconds counts from it.
	AnnotationWaitPodCompletionStart = "maintenance.nvidia.com/wait-pod-completion-start-time"
)

// NodeMaintenanceSpec is what a requestor asks for.
type NodeMaintenanceSpec struct {
	// RequestorID identifies the requestor, in domain-name notation
	// (e.g. "network.operator.nvidia.com"): 2–63 characters, alphanumerics,
	// dashes and dots, starting and ending with an alphanumeric. Immutable.
	// +kubebuilder:validation:Pattern=`^([a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?(\.[a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?)*)$`
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="requestorID is immutable"
	RequestorID string `json:"requestorID"`

	// AdditionalRequestors are other requestors sharing this object. The node
	// is released only when no requestor remains: a requestor done with the
	// node removes itself from this list; deleting the object while the list
	// is non-empty hands it to the remaining requestors.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:MinLength=2
	AdditionalRequestors []string `json:"additionalRequestors,omitempty"`

	// NodeName is the node to maintain. Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nodeName is immutable"
	NodeName string `json:"nodeName"`

	// Cordon marks the node unschedulable during the maintenance. Default true.
	// +optional
	// +kubebuilder:default=true
	Cordon *bool `json:"cordon,omitempty"`

	// WaitForPodCompletion waits for the selected pods to finish before the
	// drain. Unset: no wait.
	// +optional
	WaitForPodCompletion *WaitForPodCompletionSpec `json:"waitForPodCompletion,omitempty"`

	// DrainSpec says how to drain the node. Unset: no drain.
	// +optional
	DrainSpec *DrainSpec `json:"drainSpec,omitempty"`
}

// LabelSelectorString is a label selector in its string form
// ("app=training,tier!=web", "gpu in (a100,h100)", "!canary"); empty selects
// every pod. The schema rejects what cannot be a selector; the controller
// parses it with the Kubernetes label parser before acting on it.
// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self.matches('^[ ]*!?[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?[ ]*((=|==|!=)[ ]*([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?|[ ]+(in|notin)[ ]*[(][ ]*([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?([ ]*,[ ]*([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?)*[ ]*[)])?[ ]*(,[ ]*!?[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?[ ]*((=|==|!=)[ ]*([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?|[ ]+(in|notin)[ ]*[(][ ]*([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?([ ]*,[ ]*([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?)*[ ]*[)])?[ ]*)*$')",message="must be a label selector such as app=training or tier in (a,b),!canary"
// +kubebuilder:validation:MaxLength=1024
type LabelSelectorString string

// WaitForPodCompletionSpec selects the pods to wait for.
type WaitForPodCompletionSpec struct {
	// PodSelector is a label selector in string form ("app=training,tier!=web").
	// +optional
	PodSelector LabelSelectorString `json:"podSelector,omitempty"`

	// TimeoutSeconds bounds the wait; on expiry the maintenance proceeds and
	// a Warning event is emitted. 0 waits forever. Default 0.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
}

// DrainSpec says how to drain a node.
type DrainSpec struct {
	// Force evicts pods that have no controller (bare pods).
	// +optional
	// +kubebuilder:default=false
	Force bool `json:"force,omitempty"`

	// PodSelector restricts the drain to pods matching this label selector.
	// +optional
	PodSelector LabelSelectorString `json:"podSelector,omitempty"`

	// TimeoutSeconds: after this long the blocking pods are reported (a
	// DrainBlocked condition and a Warning event) and the drain keeps
	// retrying with backoff. 0 = no limit. Default 300.
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`

	// DeleteEmptyDir allows evicting pods that use emptyDir volumes (their
	// local data is lost).
	// +optional
	// +kubebuilder:default=false
	DeleteEmptyDir bool `json:"deleteEmptyDir,omitempty"`

	// PodEvictionFilters, when set, limit the drain to pods matching at least
	// one entry (OR between entries, AND within one).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	PodEvictionFilters []PodEvictionFilterEntry `json:"podEvictionFilters,omitempty"`
}

// PodEvictionFilterEntry selects pods to evict.
// +kubebuilder:validation:XValidation:rule="has(self.byResourceNameRegex) || has(self.byDRADriverRegex)",message="a pod eviction filter needs byResourceNameRegex or byDRADriverRegex"
type PodEvictionFilterEntry struct {
	// ByResourceNameRegex selects pods that request a resource whose name
	// matches this regular expression (e.g. "nvidia.com/gpu-*").
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	ByResourceNameRegex *string `json:"byResourceNameRegex,omitempty"`
	// ByDRADriverRegex (gpufleet) selects pods with a ResourceClaim whose
	// devices were allocated by a DRA driver whose name matches this
	// regular expression (e.g. "^gpu[.]nvidia[.]com$"); admin-access
	// allocations (monitoring) do not count, and a claim that cannot be
	// read does. With both fields set, a pod matching either is selected.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	ByDRADriverRegex *string `json:"byDRADriverRegex,omitempty"`
}

// NodeMaintenanceStatus is the observed state. The fields before the
// gpufleet section are those of the NVIDIA Maintenance Operator.
type NodeMaintenanceStatus struct {
	// Conditions: Ready (reason = phase), RequestorFailed (set by the
	// requestor), DrainBlocked, InvalidSpec.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// WaitForCompletion lists the pods (namespace/name) still waited for.
	// +optional
	WaitForCompletion []string `json:"waitForCompletion,omitempty"`

	// Drain is the drain progress.
	// +optional
	Drain *DrainStatus `json:"drain,omitempty"`

	// NodeUnschedulableBefore records whether the node was already cordoned
	// when the maintenance started; such a node stays cordoned afterwards.
	// +optional
	NodeUnschedulableBefore *bool `json:"nodeUnschedulableBefore,omitempty"`

	// ScheduledTime is when the scheduler admitted this object.
	// +optional
	ScheduledTime *metav1.Time `json:"scheduledTime,omitempty"`

	// WaitForCompletionStartTime is when waiting for pod completion began.
	// +optional
	WaitForCompletionStartTime *metav1.Time `json:"waitForCompletionStartTime,omitempty"`

	// ObservedGeneration is the generation the status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// DrainStatus is the progress of a drain.
type DrainStatus struct {
	// TotalPods on the node when the drain started.
	// +kubebuilder:validation:Minimum=0
	TotalPods int32 `json:"totalPods"`
	// EvictionPods is how many pods the drain had to evict when it started.
	// +kubebuilder:validation:Minimum=0
	EvictionPods int32 `json:"evictionPods"`
	// DrainProgress is the percentage of those pods gone.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	DrainProgress int32 `json:"drainProgress"`
	// WaitForEviction lists the pods (namespace/name) not yet gone.
	// +optional
	WaitForEviction []string `json:"waitForEviction,omitempty"`
	// StartTime is when the drain began (its timeout counts from here).
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// SpecHash (gpufleet) identifies the drainSpec this drain was for: a
	// Ready object whose drainSpec changes since drains again (a requestor
	// that needs more of the node, e.g. a driver upgrade that must reboot).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	SpecHash string `json:"specHash,omitempty"`
}

// NodeMaintenance asks for a node to be prepared for maintenance: scheduled
// under the cluster's limits, cordoned, drained and reported Ready.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=nm
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:selectablefield:JSONPath=`.spec.requestorID`
// +kubebuilder:printcolumn:name="Node",type="string",JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Requestor",type="string",JSONPath=`.spec.requestorID`
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=`.status.conditions[?(@.type=='Ready')].status`
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=`.status.conditions[?(@.type=='Ready')].reason`
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type NodeMaintenance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeMaintenanceSpec   `json:"spec,omitempty"`
	Status NodeMaintenanceStatus `json:"status,omitempty"`
}

// NodeMaintenanceList is a list of NodeMaintenance.
//
// +kubebuilder:object:root=true
type NodeMaintenanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeMaintenance `json:"items"`
}

func init() {
	register(&NodeMaintenance{}, &NodeMaintenanceList{})
}
