package repair

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// DefaultDRADriver publishes NVIDIA GPUs in ResourceSlices (NVIDIA's DRA
// driver for GPUs); a policy's gpu.draDriver overrides it.
const DefaultDRADriver = "gpu.nvidia.com"

// Device is one DRA device: what a DeviceTaintRule and a claim's
// allocation result name.
type Device struct {
	Driver, Pool, Name string
}

// draDriver is the policy's DRA driver, or the default.
func draDriver(spec *repairv1.NodeRepairPolicySpec) string {
	if spec.GPU.DRADriver != "" {
		return spec.GPU.DRADriver
	}
	return DefaultDRADriver
}

// DeviceOf finds a GPU among the devices that driver publishes for node in
// slices: by its UUID (attribute uuid), else its PCI bus ID (the standard
// attribute resource.kubernetes.io/pciBusID, which NVIDIA's DRA driver sets
// since v25.12; pcieBusID of older releases), else its index (the device
// name gpu-<index> of a full GPU, or an older index attribute). false: the
// GPU is not published through DRA (the node uses the device plugin).
func DeviceOf(slices []resourcev1.ResourceSlice, driver, node string, g repairv1.GPURef) (Device, bool) {
	type match struct {
		d    Device
		rank int
	}
	best := match{rank: -1}
	for i := range slices {
		s := &slices[i]
		if s.Spec.Driver != driver || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			continue
		}
		for _, dev := range s.Spec.Devices {
			rank := -1
			switch {
			case g.UUID != "" && strings.EqualFold(stringAttr(dev, "uuid"), g.UUID):
				rank = 2
			case g.PCIBusID != "" && (samePCI(stringAttr(dev, "pciBusID"), g.PCIBusID) || samePCI(stringAttr(dev, "pcieBusID"), g.PCIBusID)):
				rank = 1
			case g.Index != nil && (dev.Name == "gpu-"+strconv.Itoa(int(*g.Index)) || intAttr(dev, "index") == strconv.Itoa(int(*g.Index))):
				rank = 0
			}
			if rank > best.rank {
				best = match{Device{Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Name: dev.Name}, rank}
			}
		}
	}
	return best.d, best.rank >= 0
}

func stringAttr(d resourcev1.Device, name string) string {
	for k, v := range d.Attributes {
		if (string(k) == name || strings.HasSuffix(string(k), "/"+name)) && v.StringValue != nil {
			return *v.StringValue
		}
	}
	return ""
}

func intAttr(d resourcev1.Device, name string) string {
	for k, v := range d.Attributes {
		if (string(k) == name || strings.HasSuffix(string(k), "/"+name)) && v.IntValue != nil {
			return strconv.FormatInt(*v.IntValue, 10)
		}
	}
	return "-"
}

// samePCI compares PCI bus IDs in their short (00000000:3b:00.0 /
// 3b:00.0) and long (0000:3b:00.0) forms, ignoring letter case.
func samePCI(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	tail := func(s string) string {
		s = strings.ToLower(s)
		if i := strings.Index(s, ":"); i >= 0 && strings.Count(s, ":") == 2 {
			s = s[i+1:]
		}
		return s
	}
	return tail(a) == tail(b)
}

// claimNames are the names of the ResourceClaims a pod uses.
func claimNames(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Spec.ResourceClaims {
		if c.ResourceClaimName != nil {
			out = append(out, *c.ResourceClaimName)
		}
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			out = append(out, *st.ResourceClaimName)
		}
	}
	return out
}

// usesDevice reports whether a claim's allocation includes one of devices.
func usesDevice(c *resourcev1.ResourceClaim, devices []Device) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		for _, d := range devices {
			if r.Driver == d.Driver && r.Pool == d.Pool && r.Device == d.Name {
				return true
			}
		}
	}
	return false
}
