package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// fakeHost records commands; units in missing do not exist.
type fakeHost struct {
	calls   []string
	missing map[string]bool
	pods    string
	fail    map[string]bool   // commands that fail
	failOut string            // their output
	out     map[string]string // output of commands that succeed
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
	if f.fail[cmd] {
		return f.failOut, errors.New("failed")
	}
	if strings.HasPrefix(cmd, "crictl pods") {
		return f.pods, nil
	}
	if strings.HasPrefix(cmd, "systemctl is-active ") {
		if o, ok := f.out[cmd]; ok {
			return o, nil
		}
		return "inactive\n", errors.New("exit status 3")
	}
	return f.out[cmd], nil
}

// testGPUs are the GPUs of the ResetGPU tests.
var testGPUs = []repairv1.GPURef{{PCIBusID: "0000:18:00.0"}, {PCIBusID: "0000:2a:00.0", UUID: "GPU-2a"}}

// sandboxClock is 10:00; sandboxes lists NotReady sandboxes created at
// 09:50 (old), 09:59:30 (young: may be starting) and 09:57 (createdAt as a
// JSON number).
var (
	sandboxClock = clocktesting.NewFakePassiveClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	sandboxes    = fmt.Sprintf(`{"items":[{"id":"old","state":"SANDBOX_NOTREADY","createdAt":"%d"},
{"id":"young","state":"SANDBOX_NOTREADY","createdAt":"%d"},{"id":"number","createdAt":%d}]}`,
		time.Date(2026, 12, 3, 9, 50, 0, 0, time.UTC).UnixNano(), time.Date(2026, 12, 3, 9, 59, 30, 0, time.UTC).UnixNano(),
		time.Date(2026, 12, 3, 9, 57, 0, 0, time.UTC).UnixNano())
)

func TestStaleSandboxesRejectsBadInput(t *testing.T) {
	for _, in := range []string{`not json`, `{"items":[{"id":"a","createdAt":"yesterday"}]}`, `{"items":[{"createdAt":"1"}]}`} {
		if _, err := staleSandboxes([]byte(in), sandboxClock.Now(), SandboxGrace); err == nil {
			t.Errorf("%s: want an error", in)
		}
	}
	if ids, err := staleSandboxes([]byte(`{}`), sandboxClock.Now(), SandboxGrace); err != nil || len(ids) != 0 {
		t.Errorf("no sandboxes: %v, %v", ids, err)
	}
}

func TestHostExecutor(t *testing.T) {
	docker := &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{ContainerRuntimeVersion: "docker://27"}}}
	tests := map[string]struct {
		node   *corev1.Node
		action repairv1.Action
		host   *fakeHost
		want   []string
	}{
		"kubelet":             {&corev1.Node{}, repairv1.ActionRestartKubelet, &fakeHost{}, []string{"systemctl restart kubelet"}},
		"runtime is per node": {docker, repairv1.ActionRestartContainerRuntime, &fakeHost{}, []string{"systemctl restart docker"}},
		"NTP unit found":      {&corev1.Node{}, repairv1.ActionRestartNTP, &fakeHost{missing: map[string]bool{"chronyd": true}}, []string{"systemctl cat chronyd", "systemctl cat ntpd", "systemctl restart ntpd"}},
		"broken sandboxes only": {&corev1.Node{}, repairv1.ActionDeleteBrokenSandbox, &fakeHost{pods: sandboxes},
			[]string{"crictl pods --state NotReady -o json", "crictl rmp -f old", "crictl rmp -f number"}},
		"reboot": {&corev1.Node{}, repairv1.ActionReboot, &fakeHost{}, []string{"systemctl reboot"}},
		"fabric manager": {&corev1.Node{}, repairv1.ActionRestartFabricManager, &fakeHost{},
			[]string{"systemctl cat nvidia-fabricmanager", "systemctl restart nvidia-fabricmanager"}},
		"persistence daemon": {&corev1.Node{}, repairv1.ActionRestartPersistenced, &fakeHost{},
			[]string{"systemctl cat nvidia-persistenced", "systemctl restart nvidia-persistenced"}},
		"DCGM under its older unit name": {&corev1.Node{}, repairv1.ActionRestartDCGM, &fakeHost{missing: map[string]bool{"nvidia-dcgm": true}},
			[]string{"systemctl cat nvidia-dcgm", "systemctl cat dcgm", "systemctl restart dcgm"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if err := (HostExecutor{Runner: tc.host, Clock: sandboxClock}).Execute(context.Background(), tc.node, tc.action, nil); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, tc.host.calls); diff != "" {
				t.Errorf("commands (-want +got):\n%s", diff)
			}
		})
	}
	if err := (HostExecutor{Runner: &fakeHost{}}).Execute(context.Background(), &corev1.Node{}, "rm -rf /", nil); err == nil {
		t.Errorf("an action outside the enumeration ran")
	}
	// One sandbox that does not go away does not keep the others.
	stuck := &fakeHost{pods: sandboxes, fail: map[string]bool{"crictl rmp -f old": true}}
	if err := (HostExecutor{Runner: stuck, Clock: sandboxClock}).Execute(context.Background(), &corev1.Node{}, repairv1.ActionDeleteBrokenSandbox, nil); err == nil {
		t.Errorf("a sandbox was not removed: want an error")
	}
	if got := stuck.calls[len(stuck.calls)-1]; got != "crictl rmp -f number" {
		t.Errorf("after a failed removal, last command %q", got)
	}
	none := &fakeHost{missing: map[string]bool{"chronyd": true, "ntpd": true, "systemd-timesyncd": true}}
	if err := (HostExecutor{Runner: none}).Execute(context.Background(), &corev1.Node{}, repairv1.ActionRestartNTP, nil); err == nil {
		t.Errorf("no NTP unit: want an error")
	}
	noFM := &fakeHost{missing: map[string]bool{"nvidia-fabricmanager": true}}
	if err := (HostExecutor{Runner: noFM}).Execute(context.Background(), &corev1.Node{}, repairv1.ActionRestartFabricManager, nil); err == nil ||
		!strings.Contains(err.Error(), "no nvidia-fabricmanager unit") {
		t.Errorf("no Fabric Manager on the host: error %v", err)
	}
}

// logLines runs the executor with a logger that keeps every line as JSON.
func logLines(t *testing.T, h HostExecutor, node *corev1.Node, a repairv1.Action, gpus []repairv1.GPURef) ([]map[string]any, error) {
	t.Helper()
	var lines []map[string]any
	log := funcr.NewJSON(func(obj string) {
		var line map[string]any
		if err := json.Unmarshal([]byte(obj), &line); err != nil {
			t.Errorf("log line %s: %v", obj, err)
		}
		lines = append(lines, line)
	}, funcr.Options{})
	err := h.Execute(logr.NewContext(context.Background(), log), node, a, gpus)
	return lines, err
}

func TestHostExecutorLogsEachAction(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-007"}}
	keep := func(lines []map[string]any, keys ...string) []map[string]any {
		var out []map[string]any
		for _, l := range lines {
			m := map[string]any{}
			for _, k := range keys {
				if v, ok := l[k]; ok {
					m[k] = v
				}
			}
			out = append(out, m)
		}
		return out
	}
	nodeRef := map[string]any{"name": "gpu-007"}
	tests := map[string]struct {
		action  repairv1.Action
		host    *fakeHost
		wantErr bool
		want    []map[string]any
	}{
		"unit restarted": {action: repairv1.ActionRestartKubelet, host: &fakeHost{}, want: []map[string]any{
			{"msg": "running host action", "node": nodeRef, "action": "RestartKubelet", "unit": "kubelet"},
			{"msg": "host action done", "node": nodeRef, "action": "RestartKubelet"},
		}},
		"each sandbox": {action: repairv1.ActionDeleteBrokenSandbox, host: &fakeHost{pods: sandboxes}, want: []map[string]any{
			{"msg": "running host action", "node": nodeRef, "action": "DeleteBrokenSandbox", "sandbox": "old"},
			{"msg": "running host action", "node": nodeRef, "action": "DeleteBrokenSandbox", "sandbox": "number"},
			{"msg": "host action done", "node": nodeRef, "action": "DeleteBrokenSandbox"},
		}},
		"reboot": {action: repairv1.ActionReboot, host: &fakeHost{}, want: []map[string]any{
			{"msg": "running host action", "node": nodeRef, "action": "Reboot"},
			{"msg": "host action done", "node": nodeRef, "action": "Reboot"},
		}},
		"failure with the error": {action: repairv1.ActionRestartKubelet, host: &fakeHost{fail: map[string]bool{"systemctl restart kubelet": true}, failOut: "Job for kubelet.service failed.\n"}, wantErr: true,
			want: []map[string]any{
				{"msg": "running host action", "node": nodeRef, "action": "RestartKubelet", "unit": "kubelet"},
				{"msg": "host action failed", "node": nodeRef, "action": "RestartKubelet", "error": "systemctl restart kubelet: failed: Job for kubelet.service failed."},
			}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			lines, err := logLines(t, HostExecutor{Runner: tc.host, Clock: sandboxClock}, node, tc.action, nil)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want an error: %t", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, keep(lines, "msg", "node", "action", "unit", "sandbox", "error")); diff != "" {
				t.Errorf("log lines (-want +got):\n%s", diff)
			}
			for _, l := range lines {
				if l["msg"] != "running host action" {
					if _, ok := l["duration"]; !ok {
						t.Errorf("outcome without a duration: %v", l)
					}
				}
			}
		})
	}
}

func TestTrimOutput(t *testing.T) {
	if got := trimOutput("  unit not found\n"); got != "unit not found" {
		t.Errorf("trimOutput: %q", got)
	}
	long := strings.Repeat("x", 5000) + " the error"
	got := trimOutput(long)
	if !strings.HasSuffix(got, " the error") || len(got) > maxOutput+len("…") {
		t.Errorf("trimOutput of %d bytes: %d bytes, ends %q", len(long), len(got), got[len(got)-20:])
	}
}

// crdActions reads the actions the API server accepts from the generated
// NodeRepair CRD (the enum of spec.actions).
func crdActions(t *testing.T) []repairv1.Action {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", "repair.gpufleet.dev_noderepairs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("CRD versions %d, want 1", len(crd.Spec.Versions))
	}
	items := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["actions"].Items
	if items == nil || items.Schema == nil {
		t.Fatal("spec.actions of the NodeRepair CRD has no item schema")
	}
	var out []repairv1.Action
	for _, v := range items.Schema.Enum {
		var a repairv1.Action
		if err := json.Unmarshal(v.Raw, &a); err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// TestHostExecutorRunsTheFixedSetOnly: every action the API accepts has a
// host implementation; anything else is refused with an error naming it,
// before any command runs.
func TestHostExecutorRunsTheFixedSetOnly(t *testing.T) {
	known := crdActions(t)
	if diff := cmp.Diff([]repairv1.Action{repairv1.ActionRestartKubelet, repairv1.ActionRestartContainerRuntime,
		repairv1.ActionRestartNTP, repairv1.ActionDeleteBrokenSandbox, repairv1.ActionResetGPU, repairv1.ActionReboot, repairv1.ActionValidateGPU,
		repairv1.ActionRestartFabricManager, repairv1.ActionRestartPersistenced, repairv1.ActionRestartDCGM, repairv1.ActionRestartGPUStackPods}, known); diff != "" {
		t.Errorf("actions of the CRD (-want +got):\n%s", diff)
	}
	for _, a := range known {
		if !a.AgentRuns() {
			t.Run(string(a)+" is the operator's", func(t *testing.T) {
				host := &fakeHost{}
				if err := (HostExecutor{Runner: host}).Execute(context.Background(), &corev1.Node{}, a, testGPUs); err == nil || len(host.calls) != 0 {
					t.Errorf("the node agent ran %s (%v, commands %q)", a, err, host.calls)
				}
			})
			continue
		}
		t.Run(string(a), func(t *testing.T) {
			host := &fakeHost{pods: `{"items":[]}`, out: healthyAnswers(testGPUs)}
			if err := (HostExecutor{Runner: host, Clock: sandboxClock}).Execute(context.Background(), &corev1.Node{}, a, testGPUs); err != nil {
				t.Errorf("action %s of the API: %v", a, err)
			}
			if len(host.calls) == 0 {
				t.Errorf("action %s ran no host command", a)
			}
		})
	}
	for _, a := range []repairv1.Action{"", "rm -rf /", "restartkubelet", "Reboot ", "RestartKubelet; reboot"} {
		t.Run("refused "+strconv.Quote(string(a)), func(t *testing.T) {
			host := &fakeHost{}
			err := (HostExecutor{Runner: host, Clock: sandboxClock}).Execute(context.Background(), &corev1.Node{}, a, testGPUs)
			if want := fmt.Sprintf("unknown action %q", a); err == nil || err.Error() != want {
				t.Errorf("error %v, want %q", err, want)
			}
			if len(host.calls) != 0 {
				t.Errorf("commands ran for a refused action: %q", host.calls)
			}
		})
	}
}

func TestHostExecutorResetGPU(t *testing.T) {
	const (
		apps18   = "nvidia-smi --query-compute-apps=pid --format=csv,noheader -i 0000:18:00.0"
		apps2a   = "nvidia-smi --query-compute-apps=pid --format=csv,noheader -i 0000:2a:00.0"
		reset18  = "nvidia-smi --gpu-reset -i 0000:18:00.0"
		reset2a  = "nvidia-smi --gpu-reset -i 0000:2a:00.0"
		isPersd  = "systemctl is-active nvidia-persistenced"
		isDCGM   = "systemctl is-active nvidia-dcgm"
		isFabric = "systemctl is-active nvidia-fabricmanager"
	)
	active := map[string]string{isPersd: "active\n", isFabric: "active\n"}
	tests := map[string]struct {
		gpus      []repairv1.GPURef
		host      *fakeHost
		want      []string
		wantError string
	}{
		"the holders stopped, each GPU reset, the holders started again": {
			gpus: testGPUs, host: &fakeHost{out: active},
			want: []string{apps18, apps2a, isPersd, "systemctl stop nvidia-persistenced", isDCGM, isFabric,
				"systemctl stop nvidia-fabricmanager", reset18, reset2a,
				"systemctl start nvidia-persistenced", "systemctl start nvidia-fabricmanager"},
		},
		"no holder active: only the resets": {
			gpus: testGPUs[:1], host: &fakeHost{},
			want: []string{apps18, isPersd, isDCGM, isFabric, reset18},
		},
		"a GPU with processes: refused before anything is stopped": {
			gpus: testGPUs, host: &fakeHost{out: map[string]string{apps2a: "4711\n4712\n", isPersd: "active\n"}},
			want:      []string{apps18, apps2a},
			wantError: "GPU 0000:2a:00.0 is in use by processes 4711, 4712: not reset",
		},
		"a failed reset: the other GPU is reset and the holders start again": {
			gpus: testGPUs, host: &fakeHost{out: active, fail: map[string]bool{reset18: true}, failOut: "GPU 00000000:18:00.0 is currently in use by another process.\n"},
			want: []string{apps18, apps2a, isPersd, "systemctl stop nvidia-persistenced", isDCGM, isFabric,
				"systemctl stop nvidia-fabricmanager", reset18, reset2a,
				"systemctl start nvidia-persistenced", "systemctl start nvidia-fabricmanager"},
			wantError: "nvidia-smi --gpu-reset -i 0000:18:00.0: failed: GPU 00000000:18:00.0 is currently in use by another process.",
		},
		"a holder that does not stop: the ones stopped start again, no reset": {
			gpus: testGPUs[:1], host: &fakeHost{out: active, fail: map[string]bool{"systemctl stop nvidia-fabricmanager": true}},
			want: []string{apps18, isPersd, "systemctl stop nvidia-persistenced", isDCGM, isFabric,
				"systemctl stop nvidia-fabricmanager", "systemctl start nvidia-persistenced"},
			wantError: "systemctl stop nvidia-fabricmanager: failed",
		},
		"no GPU named": {host: &fakeHost{}, wantError: "no GPU to reset (the repair names none)"},
		"a GPU without its address": {gpus: []repairv1.GPURef{{UUID: "GPU-x"}}, host: &fakeHost{},
			wantError: "cannot reset GPU GPU-x: no PCI bus ID"},
		"the processes cannot be listed": {gpus: testGPUs[:1], host: &fakeHost{fail: map[string]bool{apps18: true}, failOut: "No devices were found"},
			want:      []string{apps18},
			wantError: "listing the processes on GPU 0000:18:00.0: " + apps18 + ": failed: No devices were found"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := (HostExecutor{Runner: tc.host, Clock: sandboxClock}).Execute(context.Background(), &corev1.Node{}, repairv1.ActionResetGPU, tc.gpus)
			if got := fmt.Sprint(err); (err != nil || tc.wantError != "") && got != tc.wantError {
				t.Errorf("error %q, want %q", got, tc.wantError)
			}
			if diff := cmp.Diff(tc.want, tc.host.calls); diff != "" {
				t.Errorf("commands (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHostExecutorResetGPULogsEachHostAction(t *testing.T) {
	host := &fakeHost{out: map[string]string{"systemctl is-active nvidia-dcgm": "active"}}
	lines, err := logLines(t, HostExecutor{Runner: host, Clock: sandboxClock}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-007"}},
		repairv1.ActionResetGPU, testGPUs)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range lines {
		got = append(got, fmt.Sprintf("%v %v unit=%v gpu=%v step=%v", l["msg"], l["action"], l["unit"], l["gpu"], l["step"]))
	}
	want := []string{
		"running host action ResetGPU unit=nvidia-dcgm gpu=<nil> step=stop",
		"running host action ResetGPU unit=<nil> gpu=0000:18:00.0 step=reset",
		"running host action ResetGPU unit=<nil> gpu=0000:2a:00.0 step=reset",
		"running host action ResetGPU unit=nvidia-dcgm gpu=<nil> step=start",
		"host action done ResetGPU unit=<nil> gpu=<nil> step=<nil>",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log lines (-want +got):\n%s", diff)
	}
}

// healthyAnswers is nvidia-smi's answer to the health query of each GPU:
// healthy.
func healthyAnswers(gpus []repairv1.GPURef) map[string]string {
	out := map[string]string{}
	for _, g := range gpus {
		out[healthCmd(g.PCIBusID)] = g.PCIBusID + ", 0, No, No\n"
		out["nvidia-smi --query-gpu=index --format=csv,noheader -i "+g.PCIBusID] = "3\n"
	}
	return out
}

func healthCmd(bus string) string {
	return "nvidia-smi --query-gpu=" + healthQuery + " --format=csv,noheader,nounits -i " + bus
}

func TestGPUHealth(t *testing.T) {
	for answer, want := range map[string]string{
		"00000000:18:00.0, 0, No, No\n":                  "",
		"00000000:18:00.0, [N/A], [N/A], [N/A]":          "", // a GPU without ECC (consumer boards)
		"00000000:18:00.0, [Not Supported], No, [N/A]":   "",
		"00000000:18:00.0, [GPU requires reset], No, No": "requires a reset",
		"00000000:18:00.0, 2, No, No":                    "uncorrectable ECC errors since the reset: 2",
		"00000000:18:00.0, 0, Yes, Yes":                  "retired pages pending, a row remap failed",
		"":                                               "unexpected answer",
		"No devices were found":                          "unexpected answer",
	} {
		err := GPUHealth(answer)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("GPUHealth(%q) = %v, want %q", answer, err, want)
		}
	}
}

// TestValidateGPUs: Health asks nvidia-smi about each GPU (read-only, by
// PCI address); Diagnostic also runs DCGM's quick diagnostic on its index;
// a GPU that fails, or that the driver does not answer for, is named in
// the error, and the other GPUs are still validated.
func TestValidateGPUs(t *testing.T) {
	ctx := WithValidationLevel(context.Background(), repairv1.GPUValidationDiagnostic)
	host := &fakeHost{out: healthyAnswers(testGPUs)}
	if err := (HostExecutor{Runner: host}).Execute(ctx, &corev1.Node{}, repairv1.ActionValidateGPU, testGPUs); err != nil {
		t.Fatal(err)
	}
	want := []string{healthCmd("0000:18:00.0"), "nvidia-smi --query-gpu=index --format=csv,noheader -i 0000:18:00.0", "dcgmi diag -r 1 -i 3",
		healthCmd("0000:2a:00.0"), "nvidia-smi --query-gpu=index --format=csv,noheader -i 0000:2a:00.0", "dcgmi diag -r 1 -i 3"}
	if diff := cmp.Diff(want, host.calls); diff != "" {
		t.Errorf("host commands (-want +got):\n%s", diff)
	}
	for _, c := range host.calls {
		if strings.Contains(c, "reset") || strings.Contains(c, "systemctl") {
			t.Errorf("validation ran %q: it must change nothing", c)
		}
	}
	bad := &fakeHost{out: healthyAnswers(testGPUs), fail: map[string]bool{healthCmd("0000:18:00.0"): true}}
	bad.out[healthCmd("0000:2a:00.0")] = "0000:2a:00.0, 4, No, No"
	err := (HostExecutor{Runner: bad}).Execute(context.Background(), &corev1.Node{}, repairv1.ActionValidateGPU, testGPUs)
	if err == nil || !strings.Contains(err.Error(), "GPU 0000:18:00.0: the driver does not answer") || !strings.Contains(err.Error(), "GPU 0000:2a:00.0: uncorrectable ECC errors since the reset: 4") {
		t.Errorf("error %v", err)
	}
	if slices.ContainsFunc(bad.calls, func(c string) bool { return strings.HasPrefix(c, "dcgmi") }) {
		t.Errorf("Health ran DCGM's diagnostic: %v", bad.calls)
	}
}

// FuzzGPUHealth: any answer from nvidia-smi is read without a panic, and
// only an answer of four fields naming a GPU can pass.
func FuzzGPUHealth(f *testing.F) {
	for _, s := range []string{"00000000:18:00.0, 0, No, No", "x, [N/A], [N/A], [N/A]", "", ",,,", "No devices were found"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, answer string) {
		if GPUHealth(answer) == nil {
			fields := strings.Split(strings.TrimSpace(answer), ",")
			if len(fields) != 4 || strings.TrimSpace(fields[0]) == "" {
				t.Fatalf("%q passed", answer)
			}
		}
	})
}
