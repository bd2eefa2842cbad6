package operator

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// stripDefault is the cache transform of every object without its own:
// managed fields are dropped, and a ResourceSlice is trimmed
// (stripResourceSlice).
func stripDefault(obj any) (any, error) {
	obj, err := cache.TransformStripManagedFields()(obj)
	if err != nil {
		return obj, err
	}
	return stripResourceSlice(obj)
}

// stripNode is the cache transform of nodes: no controller reads a node's
// managed fields or the images on it (a GPU node's image list alone can be
// tens of kilobytes). The decoded node is trimmed in place.
func stripNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images = nil
	}
	return obj, nil
}

// sliceAttributesRead are the device attributes the operator reads (its
// own controllers and the in-process agent of gpufleet dev): what
// identifies a GPU (internal/repair DeviceOf, internal/agent).
var sliceAttributesRead = []string{"uuid", "pciBusID", "pcieBusID", "index"}

// stripResourceSlice is the cache transform of ResourceSlices: of each
// device only its name, its taints and the attributes that identify the
// GPU are kept. A DRA GPU's other attributes and its capacity (product,
// architecture, driver and CUDA versions, memory, counters) were most of
// the operator's heap at 1,000 nodes. The decoded slice is trimmed in place.
func stripResourceSlice(obj any) (any, error) {
	s, ok := obj.(*resourcev1.ResourceSlice)
	if !ok {
		return obj, nil
	}
	s.ManagedFields = nil
	for i := range s.Spec.Devices {
		d := &s.Spec.Devices[i]
		var kept map[resourcev1.QualifiedName]resourcev1.DeviceAttribute
		for k, v := range d.Attributes {
			if attributeRead(string(k)) {
				if kept == nil {
					kept = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}
				}
				kept[k] = v
			}
		}
		*d = resourcev1.Device{Name: d.Name, Attributes: kept, Taints: d.Taints}
	}
	return obj, nil
}

// attributeRead: key is one of sliceAttributesRead, qualified or not.
func attributeRead(key string) bool {
	for _, name := range sliceAttributesRead {
		if key == name || strings.HasSuffix(key, "/"+name) {
			return true
		}
	}
	return false
}
