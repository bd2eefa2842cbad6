// Package fleet is the one view of every GPU node that `gpufleet status`,
// `gpufleet explain` and the browser view (`gpufleet ui`) show: Build
// (pure) turns the listed Nodes, Pods, ResourceClaims, NodeMaintenance,
// NodeRepair and GPUFault objects into a row per node and a summary;
// Explain (pure) tells one node's story. load.go lists the objects (one
// List per kind) and notes the kinds it could not read.
package fleet

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// State is a node's overall state, as the table and the browser view show it.
type State string

// States, most urgent first: a node has the first that applies.
const (
	StateRecoveryFailed State = "recovery failed"
	StateRepairing      State = "repairing"
	StateDraining       State = "draining"
	StateInMaintenance  State = "in maintenance"
	StateNotReady       State = "not ready"
	StateDegradedStack  State = "degraded stack"
	StateCordoned       State = "cordoned"
	StateReady          State = "ready"
)

// States lists every state, most urgent first.
var States = []State{StateRecoveryFailed, StateRepairing, StateDraining, StateInMaintenance, StateNotReady, StateDegradedStack, StateCordoned, StateReady}

// Kind names a kind the view reads; a kind it cannot read (CRD not
// installed, RBAC) is noted in Snapshot.Unavailable.
type Kind string

// Kinds the view reads.
const (
	KindNode            Kind = "nodes"
	KindPod             Kind = "pods"
	KindResourceClaim   Kind = "resourceclaims"
	KindResourceSlice   Kind = "resourceslices"
	KindNodeMaintenance Kind = "nodemaintenances"
	KindNodeRepair      Kind = "noderepairs"
	KindGPUFault        Kind = "gpufaults"
	KindEvent           Kind = "events"
	// KindMaintenanceConfig is the MaintenanceOperatorConfig named
	// "default": its spec.domains groups the nodes by NVLink domain.
	KindMaintenanceConfig Kind = "maintenanceoperatorconfigs"
	// KindComputeDomain is NVIDIA's ComputeDomain, read only to name the
	// ComputeDomains of LabelComputeDomain; never noted.
	KindComputeDomain Kind = "computedomains"
)

// DefaultPoolLabel is the node label that names a node's pool: the one
// auto-repair uses when its policy names none, and the one the simulated
// nodes of `gpufleet dev` carry.
const DefaultPoolLabel = "gpufleet.dev/pool"

// ResourceGPU is the extended resource NVIDIA's device plugin advertises.
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"

// DRADriver is the DRA driver whose allocated devices count as GPUs in use.
const DRADriver = "gpu.nvidia.com"

// StackStuckAfter is how long a GPU-stack pod may stay not Ready on a node
// before the node's stack counts as degraded.
const StackStuckAfter = 10 * time.Minute

// Snapshot is what the view is built from. Pointers are only read.
type Snapshot struct {
	Nodes        []*corev1.Node
	Pods         []*corev1.Pod
	Claims       []*resourcev1.ResourceClaim
	Slices       []*resourcev1.ResourceSlice
	Maintenances []*maintenancev1.NodeMaintenance
	Repairs      []*repairv1.NodeRepair
	Faults       []*repairv1.GPUFault
	Events       []*corev1.Event
	// Config is the MaintenanceOperatorConfig named "default" (nil: none,
	// or not read): with spec.domains, the nodes are grouped by domain.
	Config *maintenancev1.MaintenanceOperatorConfig
	// ComputeDomains are the ComputeDomains' metadata, to name the UIDs of
	// LabelComputeDomain (nil: not read; the UIDs are shown).
	ComputeDomains []*metav1.PartialObjectMetadata
	PoolLabel      string
	// Unavailable says why a kind could not be read (not installed,
	// forbidden); what comes from it shows as unknown.
	Unavailable map[Kind]string
}

// Fleet is the built view: rows sorted by node name (grouped by domain
// when the config has spec.domains), the summary, the domains, and a note
// per kind that could not be read.
type Fleet struct {
	metav1.TypeMeta `json:",inline"`
	Summary         Summary `json:"summary"`
	// DomainLabel is the config's spec.domains.nodeLabel ("": the nodes
	// are not grouped by domain).
	DomainLabel string `json:"domainLabel,omitempty"`
	// Domains summarises each domain of the rows, in full, sorted by
	// name; the nodes in no domain come last, under the name "".
	Domains []Domain `json:"domains,omitempty"`
	Rows    []Row    `json:"nodes"`
	Notes   []string `json:"notes,omitempty"`
}

// Row is one node.
type Row struct {
	Node          string       `json:"node"`
	Pool          string       `json:"pool,omitempty"`
	State         State        `json:"state"`
	Ready         bool         `json:"ready"`
	Unschedulable bool         `json:"unschedulable,omitempty"`
	GPUs          GPUs         `json:"gpus"`
	Stack         []Component  `json:"stack,omitempty"`
	DriverUpgrade string       `json:"driverUpgrade,omitempty"`
	Maintenance   *Maintenance `json:"maintenance,omitempty"`
	Repair        *Repair      `json:"repair,omitempty"`
	// Domain is the node's NVLink domain, the value of the config's
	// spec.domains.nodeLabel ("": none, or no spec.domains).
	Domain string `json:"domain,omitempty"`
	// ComputeDomain is the ComputeDomain whose workload runs on the node
	// (LabelComputeDomain); set only with spec.domains.
	ComputeDomain *ComputeDomainRef `json:"computeDomain,omitempty"`
	// Problems says, in words, why the node is not ready for work.
	Problems []string    `json:"problems,omitempty"`
	Created  metav1.Time `json:"created"`
	// Recheck is when the row changes with time alone (a GPU-stack pod
	// not Ready becomes Stuck; zero: never): a live view builds it again
	// then. Not shown.
	Recheck time.Time `json:"-"`
}

// GPUs counts a node's GPUs; nil counts are unknown (a kind could not be
// read).
type GPUs struct {
	Capacity    int64  `json:"capacity"`
	Allocatable int64  `json:"allocatable"`
	InUse       *int64 `json:"inUse,omitempty"`
	Faulty      *int64 `json:"faulty,omitempty"`
}

// ComponentStatus is where one GPU-stack component is on a node.
type ComponentStatus string

// Component statuses.
const (
	ComponentReady   ComponentStatus = "ready"   // its pod on the node is Ready
	ComponentPending ComponentStatus = "pending" // deployed to the node, pod not Ready (yet)
	ComponentStuck   ComponentStatus = "stuck"   // pod not Ready for longer than StackStuckAfter
	ComponentFailed  ComponentStatus = "failed"  // driver upgrade failed on the node
	ComponentOff     ComponentStatus = "off"     // opted out by the node's label
	ComponentAbsent  ComponentStatus = "absent"  // not (yet) deployed to the node
)

// Component is one GPU-stack component on a node.
type Component struct {
	Name   string          `json:"name"`
	Status ComponentStatus `json:"status"`
}

// Maintenance is the NodeMaintenance that matters most for a node: one
// in progress, else the oldest pending one.
type Maintenance struct {
	Namespace string              `json:"namespace"`
	Name      string              `json:"name"`
	Requestor string              `json:"requestor"`
	Phase     maintenancev1.Phase `json:"phase"`
	// Waiting is why a Pending object waits (its Ready condition's message).
	Waiting       string `json:"waiting,omitempty"`
	DrainProgress *int32 `json:"drainProgress,omitempty"`
	DrainBlocked  bool   `json:"drainBlocked,omitempty"`
	Deleting      bool   `json:"deleting,omitempty"`
	// Others counts the node's other NodeMaintenance objects.
	Others int `json:"others,omitempty"`
}

// Repair is the node's open NodeRepair (repairing or recovery failed).
type Repair struct {
	Name    string         `json:"name"`
	Phase   repairv1.Phase `json:"phase"`
	Fault   string         `json:"fault"`
	Since   metav1.Time    `json:"since"`
	Message string         `json:"message,omitempty"`
}

// Summary counts nodes by what they can do.
type Summary struct {
	Nodes int `json:"nodes"`
	// ReadyForWork: state ready.
	ReadyForWork int `json:"readyForWork"`
	// InMaintenance: in maintenance or draining.
	InMaintenance int `json:"inMaintenance"`
	Draining      int `json:"draining"`
	// Repairing: repairing or recovery failed.
	Repairing      int `json:"repairing"`
	RecoveryFailed int `json:"recoveryFailed"`
	// Degraded: not ready or degraded stack.
	Degraded      int   `json:"degraded"`
	NotReady      int   `json:"notReady"`
	DegradedStack int   `json:"degradedStack"`
	Cordoned      int   `json:"cordoned"`
	GPUs          int64 `json:"gpus"`
	GPUsInUse     int64 `json:"gpusInUse"`
	GPUsFaulty    int64 `json:"gpusFaulty"`
	// Pools counts nodes per pool ("" = no pool label).
	Pools map[string]int `json:"pools,omitempty"`
}

// Domain summarises one NVLink domain: its nodes (all of them, also those
// a filter hides), whether it is disrupted, and what runs there.
type Domain struct {
	// Name is the value of the domain label ("": the nodes in no domain).
	Name  string `json:"name"`
	Nodes int    `json:"nodes"`
	// Pools are the pools of its nodes, sorted ("" for nodes in no pool,
	// last); a domain split across pools has several.
	Pools        []string `json:"pools,omitempty"`
	ReadyForWork int      `json:"readyForWork"`
	// InMaintenance counts its nodes with a NodeMaintenance past Pending:
	// those that disrupt the domain, as the maintenance scheduler counts.
	InMaintenance int `json:"inMaintenance"`
	// PendingMaintenance counts its nodes whose NodeMaintenance waits.
	PendingMaintenance int `json:"pendingMaintenance"`
	// Disrupted: a node of the domain is in maintenance (never for "").
	Disrupted bool  `json:"disrupted"`
	GPUs      int64 `json:"gpus"`
	GPUsInUse int64 `json:"gpusInUse"`
	// ComputeDomains are the ComputeDomain workloads on its nodes, the
	// one on the most nodes first.
	ComputeDomains []ComputeDomainUse `json:"computeDomains,omitempty"`
}

// ComputeDomainRef is a ComputeDomain (resource.nvidia.com) by UID, and
// by name when its metadata could be read.
type ComputeDomainRef struct {
	UID string `json:"uid"`
	// Name is "namespace/name" ("" when unknown).
	Name string `json:"name,omitempty"`
}

// ComputeDomainUse is a ComputeDomain workload on some nodes of a domain.
type ComputeDomainUse struct {
	ComputeDomainRef `json:",inline"`
	Nodes            int `json:"nodes"`
}
