package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// DefaultConfigName is the name of the MaintenanceOperatorConfig that counts
// (in the operator's namespace).
const DefaultConfigName = "default"

// LogLevel is the operator's log level.
// +kubebuilder:validation:Enum=debug;info;error
type LogLevel string

// MaintenanceOperatorConfigSpec holds the cluster-wide maintenance limits.
type MaintenanceOperatorConfigSpec struct {
	// MaxParallelOperations is how many nodes may be in maintenance at once:
	// an integer or a percentage of all nodes ("10%", rounded up). 0 stops
	// new maintenance from starting. Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxParallelOperations must be a non-negative integer or a percentage between 0% and 100%"
	MaxParallelOperations *intstr.IntOrString `json:"maxParallelOperations,omitempty"`

	// MaxUnavailable is how many nodes may be unavailable (in maintenance,
	// cordoned or not Ready) before no new node may start maintenance: an
	// integer or a percentage of all nodes ("20%", rounded down). 0 lets
	// maintenance continue only on nodes that are already unavailable.
	// Unset: no limit.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailable must be a non-negative integer or a percentage between 0% and 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// LogLevel of the operator: debug, info or error. Default info.
	// +optional
	// +kubebuilder:default=info
	LogLevel LogLevel `json:"logLevel,omitempty"`

	// MaxNodeMaintenanceTimeSeconds: a NodeMaintenance that has been Ready
	// for longer is garbage-collected. 0 disables garbage collection.
	// Default 3600.
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=0
	MaxNodeMaintenanceTimeSeconds *int32 `json:"maxNodeMaintenanceTimeSeconds,omitempty"`

	// MaintenanceWindows (gpufleet) restrict when new maintenance starts:
	// a Pending NodeMaintenance is scheduled only while one of the windows
	// is open (and no exclusion applies). Maintenance in progress when a
	// window closes finishes. Unset: maintenance may start at any time.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	MaintenanceWindows []MaintenanceWindow `json:"maintenanceWindows,omitempty"`

	// MaintenanceExclusions (gpufleet) are periods in which no new
	// maintenance starts, even inside a window (e.g. an end-of-quarter
	// freeze). Urgent requests are not held back by them (see
	// urgentMaintenance).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	MaintenanceExclusions []MaintenanceExclusion `json:"maintenanceExclusions,omitempty"`

	// Pools (gpufleet) give groups of nodes their own limits, applied on top
	// of the cluster-wide ones: a node may start maintenance only when the
	// cluster-wide limits and those of every pool it belongs to allow it.
	// A node in no pool has only the cluster-wide limits.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Pools []MaintenancePool `json:"pools,omitempty"`

	// UrgentMaintenance (gpufleet) says which urgent NodeMaintenance objects
	// (annotation maintenance.gpufleet.dev/urgent: "true") may start outside
	// the maintenance windows and during exclusions. UnavailableNodes (the
	// default): only those of nodes that are already unavailable (not Ready
	// or cordoned), which takes nothing more from the cluster. AllNodes:
	// every urgent object. Limits and pool budgets always apply.
	// +optional
	// +kubebuilder:default=UnavailableNodes
	UrgentMaintenance UrgentMaintenanceScope `json:"urgentMaintenance,omitempty"`

	// Domains (gpufleet) make the scheduler topology-aware: nodes whose
	// GPUs share one NVLink domain (a GB200/GB300 NVL72 rack, say) are
	// disrupted together, so a job spanning the domain is interrupted once
	// per rollout rather than once per node. Unset: nodes are scheduled one
	// by one, as by NVIDIA's Maintenance Operator.
	// +optional
	Domains *MaintenanceDomains `json:"domains,omitempty"`
}

// LabelComputeDomain is the node label of NVIDIA's DRA driver: while a
// workload pod of a ComputeDomain (resource.nvidia.com, a multi-node
// NVLink job) is prepared on a node, the driver's kubelet plugin labels
// the node with it, its value the ComputeDomain's UID, and removes it when
// the last such pod is gone. gpufleet reads it: a domain with such a node
// is busy (see MaintenanceDomains).
const LabelComputeDomain = "resource.nvidia.com/computeDomain"

// ComputeDomainListGVK is the list of NVIDIA's ComputeDomains, read as
// metadata only to name the UIDs of LabelComputeDomain.
var ComputeDomainListGVK = schema.GroupVersionKind{Group: "resource.nvidia.com", Version: "v1beta1", Kind: "ComputeDomainList"}

// MaintenanceDomains groups nodes into failure domains (NVLink domains)
// by a node label.
type MaintenanceDomains struct {
	// NodeLabel is the node label whose value names the node's domain,
	// e.g. nvidia.com/gpu.clique (set by GPU feature discovery). A node
	// without the label, or with an empty value, is in no domain and is
	// scheduled as without domains.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')",message="nodeLabel must be a label key such as nvidia.com/gpu.clique"
	NodeLabel string `json:"nodeLabel"`

	// MaxDisruptedDomains is how many domains may be disrupted (have a node
	// in maintenance) at once: an integer or a percentage of the domains
	// ("25%", rounded up). It is checked before the node limits: a node
	// whose domain is not yet disrupted waits while the limit is reached;
	// nodes of domains already disrupted, and nodes in no domain, are not
	// held back by it. 0 lets maintenance continue only in domains already
	// disrupted. Unset: no domain limit.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=4
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxDisruptedDomains must be a non-negative integer or a percentage between 0% and 100%"
	MaxDisruptedDomains *intstr.IntOrString `json:"maxDisruptedDomains,omitempty"`

	// CoSchedule: while a domain is disrupted (one of its nodes is in
	// maintenance or starts now), the pending maintenance of its other
	// nodes takes free slots before that of nodes in undisrupted domains,
	// within every limit, so the domain is interrupted once. Urgent
	// requests still rank first. false: the domain limit applies but the
	// ranking is node by node. Default true.
	// +optional
	// +kubebuilder:default=true
	CoSchedule *bool `json:"coSchedule,omitempty"`

	// CollectSeconds: a domain with no node in maintenance starts only
	// once its oldest pending request is this old, or once every node of
	// it has a pending request, so that the requests a rollout creates for
	// the domain's nodes one after another are there to start together
	// (co-scheduling joins only requests that exist).
	// The domain's requests wait meanwhile, saying so. Urgent requests,
	// and domains already disrupted, do not wait. 0: start at once.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	CollectSeconds *int32 `json:"collectSeconds,omitempty"`

	// WaitForComputeDomains: a NodeMaintenance with waitForPodCompletion
	// also waits, within the same timeoutSeconds, until no node of its
	// domain runs a ComputeDomain's workload (NVIDIA's DRA driver labels
	// such a node resource.nvidia.com/computeDomain while a workload pod
	// of the ComputeDomain is prepared on it), so no node of a domain is
	// drained under a multi-node job that spans it. Default false.
	// +optional
	WaitForComputeDomains bool `json:"waitForComputeDomains,omitempty"`

	// UpgradeByDomain: gpufleet's driver upgrades request maintenance for
	// every node of a domain that needs the new driver at once, so the
	// domain changes its driver in one interruption. A domain starts when
	// fewer nodes than maxParallelUpgrades are upgrading; it may then
	// exceed that limit (a domain is never split by it). The maintenance
	// limits still apply. Nodes in no domain are upgraded one by one.
	// Default false.
	// +optional
	UpgradeByDomain bool `json:"upgradeByDomain,omitempty"`
}

// UrgentMaintenanceScope says which urgent requests pass a closed window.
// +kubebuilder:validation:Enum=UnavailableNodes;AllNodes
type UrgentMaintenanceScope string

// Urgent maintenance scopes.
const (
	UrgentUnavailableNodes UrgentMaintenanceScope = "UnavailableNodes"
	UrgentAllNodes         UrgentMaintenanceScope = "AllNodes"
)

// MaintenanceWindow is a recurring period in which maintenance may start.
// +kubebuilder:validation:XValidation:rule="!has(self.duration) || duration(self.duration) > duration('0s')",message="duration must be positive"
// +kubebuilder:validation:XValidation:rule="!has(self.duration) || duration(self.duration) <= duration('168h')",message="duration must be at most 168h (a week)"
type MaintenanceWindow struct {
	// Name identifies the window in messages.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// Schedule is when the window opens, in cron syntax with five fields
	// (minute hour day-of-month month day-of-week), e.g. "0 1 * * 1-5" for
	// weekdays at 01:00, or a descriptor such as @daily. It is read in
	// timeZone: on a day when that wall-clock time does not exist (the
	// clocks go forward) the window opens when the clocks change; on a day
	// when it happens twice, at the first.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^@(yearly|annually|monthly|weekly|daily|midnight|hourly)$') || self.matches('^[0-9*,/?A-Za-z-]+( +[0-9*,/?A-Za-z-]+){4}$')",message="schedule must be five cron fields (minute hour day-of-month month day-of-week, e.g. \"0 1 * * 1-5\") or a descriptor such as @daily; set the time zone in timeZone, not in the schedule"
	Schedule string `json:"schedule"`
	// Duration is how long the window stays open once opened (elapsed
	// time, e.g. "4h" or "90m"); more than 0, at most 168h.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(s|m|h))+$`
	Duration metav1.Duration `json:"duration"`
	// TimeZone is the IANA time zone of the schedule, e.g. "Europe/Berlin".
	// Default UTC.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9_+./-]*$`
	TimeZone string `json:"timeZone,omitempty"`
}

// MaintenanceExclusion is an absolute period in which no new maintenance
// starts.
// +kubebuilder:validation:XValidation:rule="self.end > self.start",message="an exclusion must end after it starts"
type MaintenanceExclusion struct {
	// Name identifies the exclusion in messages.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// Start of the exclusion (RFC 3339, e.g. "2026-12-20T00:00:00+01:00").
	Start metav1.Time `json:"start"`
	// End of the exclusion (exclusive).
	End metav1.Time `json:"end"`
}

// MaintenancePool is a group of nodes with its own limits.
// +kubebuilder:validation:XValidation:rule="has(self.maxParallelOperations) || has(self.maxUnavailable)",message="a pool needs maxParallelOperations or maxUnavailable"
type MaintenancePool struct {
	// Name identifies the pool in wait reasons.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// NodeSelector chooses the pool's nodes (an empty selector: every node).
	NodeSelector metav1.LabelSelector `json:"nodeSelector"`
	// MaxParallelOperations is how many of the pool's nodes may be in
	// maintenance at once: an integer or a percentage of the pool's nodes
	// (rounded up). Unset: only the cluster-wide limit.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=4
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxParallelOperations must be a non-negative integer or a percentage between 0% and 100%"
	MaxParallelOperations *intstr.IntOrString `json:"maxParallelOperations,omitempty"`
	// MaxUnavailable is how many of the pool's nodes may be unavailable: an
	// integer or a percentage of the pool's nodes (rounded down). Unset: no
	// pool limit.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=4
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailable must be a non-negative integer or a percentage between 0% and 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// Condition types of a MaintenanceOperatorConfig (gpufleet).
const (
	// ConfigConditionInvalid is True when the config passed the schema but
	// cannot be applied (a cron expression, time zone or selector that does
	// not parse); the previous valid config keeps applying, and without one
	// nothing is scheduled.
	ConfigConditionInvalid = "InvalidConfig"
	// ConfigConditionWindowOpen is True while new maintenance may start
	// under the windows and exclusions; its message says when that changes.
	ConfigConditionWindowOpen = "MaintenanceWindowOpen"
	// ConfigConditionOtherOperatorActive is True while NVIDIA's Maintenance
	// Operator holds its leader lease: gpufleet then leaves every
	// NodeMaintenance to it; its message names the lease and its holder.
	ConfigConditionOtherOperatorActive = "OtherOperatorActive"
)

// MaintenanceOperatorConfigStatus is written by gpufleet's scheduler.
type MaintenanceOperatorConfigStatus struct {
	// ObservedGeneration is the generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: InvalidConfig, MaintenanceWindowOpen and OtherOperatorActive.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MaintenanceOperatorConfig configures the maintenance scheduler. Only the
// object named "default" in the operator's namespace is used.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=moc
// +kubebuilder:printcolumn:name="MaxParallel",type="string",JSONPath=`.spec.maxParallelOperations`
// +kubebuilder:printcolumn:name="MaxUnavailable",type="string",JSONPath=`.spec.maxUnavailable`
// +kubebuilder:printcolumn:name="Window",type="string",JSONPath=`.status.conditions[?(@.type=="MaintenanceWindowOpen")].status`
// +kubebuilder:printcolumn:name="Invalid",type="string",JSONPath=`.status.conditions[?(@.type=="InvalidConfig")].status`
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:subresource:status
type MaintenanceOperatorConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec MaintenanceOperatorConfigSpec `json:"spec,omitempty"`
	// +optional
	Status MaintenanceOperatorConfigStatus `json:"status,omitempty"`
}

// MaintenanceOperatorConfigList is a list of MaintenanceOperatorConfig.
//
// +kubebuilder:object:root=true
type MaintenanceOperatorConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MaintenanceOperatorConfig `json:"items"`
}

func init() {
	register(&MaintenanceOperatorConfig{}, &MaintenanceOperatorConfigList{})
}
