package maintenance

// Event reasons emitted on NodeMaintenance objects.
const (
	ReasonScheduled            = "Scheduled"
	ReasonCordoned             = "Cordoned"
	ReasonWaitingForPods       = "WaitForPodCompletion"
	ReasonPodCompletionTimeout = "PodCompletionTimeout" // Warning
	ReasonDraining             = "Draining"
	ReasonDrainBlocked         = "DrainBlocked" // Warning
	ReasonDrainFailed          = "DrainFailed"  // Warning: pods the drain may not touch
	ReasonReady                = "Ready"
	ReasonRequestorFailed      = "RequestorFailed" // Warning
	ReasonInvalidSpec          = "InvalidSpec"     // Warning
	ReasonUncordoned           = "Uncordoned"
	ReasonLeftCordoned         = "LeftCordoned"
	ReasonWaitingForRequestors = "WaitingForRequestors"
	ReasonGarbageCollected     = "GarbageCollected"
	ReasonNodeDeleted          = "NodeDeleted" // Warning
	// ReasonRecordoned (Warning): the node was uncordoned from outside
	// while its maintenance held it; cordoned again (and, once Ready,
	// drained again).
	ReasonRecordoned = "Recordoned"
	// ReasonDrainAgain: the drainSpec of a Ready object changed; drained
	// again with it.
	ReasonDrainAgain = "DrainAgain"
	// ReasonRetained: an object past maxNodeMaintenanceTimeSeconds is kept
	// (its requestor ends it within its own bounds).
	ReasonRetained = "Retained"
)

// Event reasons emitted on the MaintenanceOperatorConfig.
const (
	ReasonInvalidConfig = "InvalidConfig" // Warning: the previous valid config keeps applying
	ReasonConfigValid   = "ConfigValid"
	// ReasonOtherOperatorActive (Warning): NVIDIA's Maintenance Operator
	// holds its leader lease; gpufleet does not act on NodeMaintenance.
	ReasonOtherOperatorActive = "OtherOperatorActive"
)

// Event actions (events.k8s.io/v1 requires one).
const (
	actionSchedule = "Schedule"
	actionCordon   = "Cordon"
	actionWait     = "WaitForPods"
	actionDrain    = "Drain"
	actionEvict    = "Evict"
	actionRelease  = "Release"
	actionValidate = "Validate"
	actionCollect  = "GarbageCollect"
)
