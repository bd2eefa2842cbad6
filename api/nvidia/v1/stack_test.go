package v1_test

import (
	"testing"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

func TestPodComponent(t *testing.T) {
	cases := map[string]struct {
		labels map[string]string
		want   string
	}{
		"gpufleet's":                 {map[string]string{nvidiav1.LabelManagedBy: "gpufleet", nvidiav1.LabelComponent: nvidiav1.DevicePlugin, "app": "x"}, nvidiav1.DevicePlugin},
		"GPU Operator device plugin": {map[string]string{"app": "nvidia-device-plugin-daemonset", nvidiav1.LabelManagedBy: "gpu-operator"}, nvidiav1.DevicePlugin},
		"GPU Operator driver":        {map[string]string{"app": "nvidia-driver-daemonset", nvidiav1.LabelComponent: "nvidia-driver"}, nvidiav1.Driver},
		"NVIDIADriver-mode driver":   {map[string]string{"app": "nvidia-gpu-driver-ubuntu22.04-7c6d7bd86b", nvidiav1.LabelComponent: "nvidia-driver"}, nvidiav1.Driver},
		"validator":                  {map[string]string{"app": "nvidia-operator-validator", "app.kubernetes.io/part-of": "gpu-operator"}, nvidiav1.Validator},
		"gpufleet's agent":           {map[string]string{"app.kubernetes.io/name": "gpufleet-agent"}, ""},
		"none":                       {nil, ""},
	}
	for name, tc := range cases {
		if got := nvidiav1.PodComponent(tc.labels); got != tc.want {
			t.Errorf("%s: PodComponent = %q, want %q", name, got, tc.want)
		}
	}
}
