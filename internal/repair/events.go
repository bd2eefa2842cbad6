package repair

import repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"

// Node labels, annotations, condition types and event reasons of auto-repair.
const (
	// LabelState shows Repairing or RecoveryFailed on the node.
	LabelState = "repair.gpufleet.dev/state"
	// AnnotationRecommendation on a node says what a person has to do after
	// a repair that ended with a recommendation (e.g. replace a GPU).
	AnnotationRecommendation = "repair.gpufleet.dev/recommendation"
	// LabelGPUDrain on a pod marks it for the drain of a GPU repair (the
	// NodeRepair's UID): the NodeMaintenance drains only these pods.
	LabelGPUDrain = "repair.gpufleet.dev/gpu-drain"
	// DefaultPoolLabel groups nodes into pools when the policy names none.
	DefaultPoolLabel = "gpufleet.dev/pool"
	// Requestor of the NodeMaintenance a rebooting repair uses.
	Requestor = repairv1.RequestorID

	// annotationFaults holds when gpufleet first saw each rule match
	// (JSON: rule -> RFC3339), so its clock survives operator restarts.
	annotationFaults = "repair.gpufleet.dev/faults-since"
	// labelResolved marks a RecoveryFailed NodeRepair whose fault cleared.
	labelResolved = "repair.gpufleet.dev/resolved"
	// labelNode on a NodeRepair names its node.
	labelNode = "repair.gpufleet.dev/node"

	// conditionBusy (RepairsBlocked) on the policy lists repairs that wait.
	conditionBusy = "RepairsBlocked"
	// conditionInvalid (InvalidSpec) on the policy: it cannot be applied.
	conditionInvalid = "InvalidSpec"

	ReasonStart   = "NodeRepairStart"
	ReasonAction  = "NodeRepairAction"
	ReasonSucceed = "NodeRepairSucceed"
	ReasonFailed  = "NodeRepairFailed" // Warning
	ReasonIgnore  = "NodeRepairIgnore"
	ReasonBlocked = "NodeRepairBlocked"
	// ReasonValidationFailed: a repaired GPU failed its validation and was
	// not returned to service (Warning).
	ReasonValidationFailed = "GPUValidationFailed"
	actionRepair           = "Repair"
)
