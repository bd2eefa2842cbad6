package agent

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// fakeHost records commands; units in missing do not exist.
type fakeHost struct {
	calls   []string
	missing map[string]bool
	pods    string
}

func (f *fakeHost) Run(_ context.Context, name string, args ...string) (string, error) {
	cmd := strings.Join(args[8:], " ") // after "nsenter --target 1 ... --"
	f.calls = append(f.calls, cmd)
	if name != "nsenter" {
		return "", errors.New("not through nsenter")
	}
	if strings.HasPrefix(cmd, "systemctl cat ") && f.missing[strings.TrimPrefix(cmd, "systemctl cat ")] {
		return "", errors.New("no such unit")
	}
	if strings.HasPrefix(cmd, "crictl pods") {
		return f.pods, nil
	}
	return "", nil
}

func TestHostExecutor(t *testing.T) {
	docker := &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{ContainerRuntimeVersion: "docker://27"}}}
	tests := map[string]struct {
		node   *corev1.Node
		action repairv1.Action
		host   *fakeHost
		want   []string
	}{
		"kubelet":               {&corev1.Node{}, repairv1.ActionRestartKubelet, &fakeHost{}, []string{"systemctl restart kubelet"}},
		"runtime is per node":   {docker, repairv1.ActionRestartContainerRuntime, &fakeHost{}, []string{"systemctl restart docker"}},
		"NTP unit found":        {&corev1.Node{}, repairv1.ActionRestartNTP, &fakeHost{missing: map[string]bool{"chronyd": true}}, []string{"systemctl cat chronyd", "systemctl cat ntpd", "systemctl restart ntpd"}},
		"broken sandboxes only": {&corev1.Node{}, repairv1.ActionDeleteBrokenSandbox, &fakeHost{pods: "abc\ndef\n"}, []string{"crictl pods --state NotReady -q", "crictl rmp -f abc", "crictl rmp -f def"}},
		"reboot":                {&corev1.Node{}, repairv1.ActionReboot, &fakeHost{}, []string{"systemctl reboot"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if err := (HostExecutor{Runner: tc.host}).Execute(context.Background(), tc.node, tc.action); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, tc.host.calls); diff != "" {
				t.Errorf("commands (-want +got):\n%s", diff)
			}
		})
	}
	if err := (HostExecutor{Runner: &fakeHost{}}).Execute(context.Background(), &corev1.Node{}, "rm -rf /"); err == nil {
		t.Errorf("an action outside the enumeration ran")
	}
	none := &fakeHost{missing: map[string]bool{"chronyd": true, "ntpd": true, "systemd-timesyncd": true}}
	if err := (HostExecutor{Runner: none}).Execute(context.Background(), &corev1.Node{}, repairv1.ActionRestartNTP); err == nil {
		t.Errorf("no NTP unit: want an error")
	}
}
