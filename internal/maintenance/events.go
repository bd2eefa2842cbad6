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
