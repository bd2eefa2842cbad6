package devcluster

import (
	"fmt"

	"github.com/google/uuid"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// simGPUNamespace seeds the simulated GPUs' UUIDs.
var simGPUNamespace = uuid.MustParse("0e4f8c2a-6f1d-4b8e-9a57-3c1f2d9b7e60")

// SimGPU is the identity of GPU i of a simulated node: stable across runs,
// the same for the simulated DRA driver (its ResourceSlice device
// "gpu-<i>"), the simulated dcgm-exporter and kernel log, and the tests.
func SimGPU(node string, i int) repairv1.GPURef {
	id := uuid.NewSHA1(simGPUNamespace, fmt.Appendf(nil, "%s/%d", node, i))
	return repairv1.GPURef{
		Index:    ptr.To(int32(i)),
		UUID:     "GPU-" + id.String(),
		PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x10+8*(i%30)),
	}
}

// SimGPUDevice is the name of GPU i in the simulated DRA driver's
// ResourceSlice, as NVIDIA's DRA driver names full GPUs.
func SimGPUDevice(i int) string { return fmt.Sprintf("gpu-%d", i) }
