package gpufault

import (
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// DeviceTaintsChanged reports whether the taints a DRA driver put on the
// devices of a ResourceSlice differ between two versions of it (or its
// devices do): what the node agent's GPU monitor and the repair
// controller watch slices for, not every republish.
func DeviceTaintsChanged(o, n *resourcev1.ResourceSlice) bool {
	if len(o.Spec.Devices) != len(n.Spec.Devices) {
		return true
	}
	for i := range o.Spec.Devices {
		if !equality.Semantic.DeepEqual(o.Spec.Devices[i].Taints, n.Spec.Devices[i].Taints) {
			return true
		}
	}
	return false
}
