package operator

import (
	corev1 "k8s.io/api/core/v1"
)

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
