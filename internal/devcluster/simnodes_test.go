package devcluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

func TestNodeSpecNode(t *testing.T) {
	gpuCapacity := func(gpus int64) corev1.ResourceList {
		r := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("96"), corev1.ResourceMemory: resource.MustParse("1Ti"),
			corev1.ResourcePods: resource.MustParse("110")}
		if gpus > 0 {
			r[devcluster.ResourceGPU] = *resource.NewQuantity(gpus, resource.DecimalSI)
		}
		return r
	}
	baseLabels := func(name, osID, osVersion, kernel string, extra map[string]string) map[string]string {
		l := map[string]string{"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			devcluster.LabelNFDOSID: osID, devcluster.LabelNFDOSVersion: osVersion, devcluster.LabelNFDKernel: kernel}
		for k, v := range extra {
			l[k] = v
		}
		return l
	}
	nvidiaPCI := map[string]string{devcluster.LabelNFDNvidiaPCI: "true", "feature.node.kubernetes.io/pci-0302_10de.present": "true"}
	withPool := func(pool string, l map[string]string) map[string]string {
		out := map[string]string{devcluster.LabelPool: pool}
		for k, v := range l {
			out[k] = v
		}
		return out
	}
	type want struct {
		labels                   map[string]string
		capacity                 corev1.ResourceList
		osImage, runtime, kernel string
		spec                     corev1.NodeSpec
	}
	taint := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	tests := map[string]struct {
		spec devcluster.NodeSpec
		want want
	}{
		"defaults: ubuntu 22.04, containerd": {
			spec: devcluster.NodeSpec{Name: "gpu-x", Pool: "pool-a", GPUs: 8},
			want: want{labels: baseLabels("gpu-x", "ubuntu", "22.04", "5.15.0-126-generic", withPool("pool-a", nvidiaPCI)),
				capacity: gpuCapacity(8), osImage: "Ubuntu 22.04 LTS", runtime: devcluster.RuntimeContainerd, kernel: "5.15.0-126-generic"},
		},
		"CPU only: no NVIDIA PCI labels, no GPUs": {
			spec: devcluster.NodeSpec{Name: "cpu-1", Pool: "cpu"},
			want: want{labels: baseLabels("cpu-1", "ubuntu", "22.04", "5.15.0-126-generic", map[string]string{devcluster.LabelPool: "cpu"}),
				capacity: gpuCapacity(0), osImage: "Ubuntu 22.04 LTS", runtime: devcluster.RuntimeContainerd, kernel: "5.15.0-126-generic"},
		},
		"no pool: no pool label": {
			spec: devcluster.NodeSpec{Name: "gpu-y", GPUs: 4},
			want: want{labels: baseLabels("gpu-y", "ubuntu", "22.04", "5.15.0-126-generic", nvidiaPCI),
				capacity: gpuCapacity(4), osImage: "Ubuntu 22.04 LTS", runtime: devcluster.RuntimeContainerd, kernel: "5.15.0-126-generic"},
		},
		"rhel with cri-o and its kernel": {
			spec: devcluster.NodeSpec{Name: "rh-1", Pool: "b", GPUs: 2, OSID: "rhel", OSVersion: "9.4", Runtime: devcluster.RuntimeCRIO, Kernel: "5.14.0-427.el9.x86_64"},
			want: want{labels: baseLabels("rh-1", "rhel", "9.4", "5.14.0-427.el9.x86_64", withPool("b", nvidiaPCI)),
				capacity: gpuCapacity(2), osImage: "Red Hat Enterprise Linux 9.4", runtime: devcluster.RuntimeCRIO, kernel: "5.14.0-427.el9.x86_64"},
		},
		"another OS with docker": {
			spec: devcluster.NodeSpec{Name: "r-1", GPUs: 1, OSID: "rocky", OSVersion: "9", Runtime: devcluster.RuntimeDocker},
			want: want{labels: baseLabels("r-1", "rocky", "9", "5.15.0-126-generic", nvidiaPCI),
				capacity: gpuCapacity(1), osImage: "rocky 9", runtime: devcluster.RuntimeDocker, kernel: "5.15.0-126-generic"},
		},
		"extra labels are added and win": {
			spec: devcluster.NodeSpec{Name: "gpu-z", Pool: "a", GPUs: 8,
				Labels: map[string]string{devcluster.LabelPool: "override", "nvidia.com/gpu.deploy.driver": "false"}},
			want: want{labels: baseLabels("gpu-z", "ubuntu", "22.04", "5.15.0-126-generic",
				withPool("override", map[string]string{devcluster.LabelNFDNvidiaPCI: "true", "feature.node.kubernetes.io/pci-0302_10de.present": "true",
					"nvidia.com/gpu.deploy.driver": "false"})),
				capacity: gpuCapacity(8), osImage: "Ubuntu 22.04 LTS", runtime: devcluster.RuntimeContainerd, kernel: "5.15.0-126-generic"},
		},
		"cordoned and tainted": {
			spec: devcluster.NodeSpec{Name: "gpu-c", GPUs: 8, Unschedulable: true, Taints: []corev1.Taint{taint}},
			want: want{labels: baseLabels("gpu-c", "ubuntu", "22.04", "5.15.0-126-generic", nvidiaPCI),
				capacity: gpuCapacity(8), osImage: "Ubuntu 22.04 LTS", runtime: devcluster.RuntimeContainerd, kernel: "5.15.0-126-generic",
				spec: corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{taint}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := tc.spec.Node()
			info := n.Status.NodeInfo
			for field, id := range map[string]string{"bootID": info.BootID, "machineID": info.MachineID, "systemUUID": info.SystemUUID} {
				if _, err := uuid.Parse(id); err != nil {
					t.Errorf("%s %q is not a UUID: %v", field, id, err)
				}
			}
			wantNode := &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: tc.spec.Name, Labels: tc.want.labels,
					Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}},
				Spec: tc.want.spec,
				Status: corev1.NodeStatus{
					Capacity: tc.want.capacity, Allocatable: tc.want.capacity,
					NodeInfo: corev1.NodeSystemInfo{Architecture: "amd64", OperatingSystem: "linux", OSImage: tc.want.osImage,
						KernelVersion: tc.want.kernel, ContainerRuntimeVersion: tc.want.runtime, KubeletVersion: "v1.37.2",
						BootID: info.BootID, MachineID: info.MachineID, SystemUUID: info.SystemUUID},
				},
			}
			if diff := cmp.Diff(wantNode, n); diff != "" {
				t.Errorf("node (-want +got):\n%s", diff)
			}
			for k, v := range n.Labels {
				if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
					t.Errorf("label %s=%q is not a valid label value: %v", k, v, errs)
				}
			}
			// Allocatable is a copy: changing it does not change capacity.
			n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("1")
			if q := n.Status.Capacity[corev1.ResourceCPU]; q.String() != "96" {
				t.Errorf("capacity shares its map with allocatable: cpu %s", q.String())
			}
		})
	}
	a, b := devcluster.NodeSpec{Name: "same"}.Node(), devcluster.NodeSpec{Name: "same"}.Node()
	if a.Status.NodeInfo.BootID == b.Status.NodeInfo.BootID || a.Status.NodeInfo.SystemUUID == b.Status.NodeInfo.SystemUUID {
		t.Errorf("two nodes share a boot ID or system UUID: %s, %s", a.Status.NodeInfo.BootID, a.Status.NodeInfo.SystemUUID)
	}
}

// TestSimulatedNodesReadAsRealOnes: what the GPU stack reads off a
// simulated node (the runtime from nodeInfo, the OS from NFD labels) is
// what the spec asked for.
func TestSimulatedNodesReadAsRealOnes(t *testing.T) {
	tests := map[string]struct {
		spec        devcluster.NodeSpec
		wantRuntime string
		wantOS      gpustack.OSFlavour
	}{
		"containerd":  {devcluster.NodeSpec{Name: "a", GPUs: 1}, "containerd", gpustack.OSFlavour{ID: "ubuntu", Version: "22.04"}},
		"docker":      {devcluster.NodeSpec{Name: "b", GPUs: 1, Runtime: devcluster.RuntimeDocker}, "docker", gpustack.OSFlavour{ID: "ubuntu", Version: "22.04"}},
		"cri-o, rhel": {devcluster.NodeSpec{Name: "c", GPUs: 1, Runtime: devcluster.RuntimeCRIO, OSID: "rhel", OSVersion: "9.4"}, "crio", gpustack.OSFlavour{ID: "rhel", Version: "9.4"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := tc.spec.Node()
			// "none" as the fallback: a runtime the GPU stack does not recognise shows.
			if got := gpustack.Runtime(n, "none"); got != tc.wantRuntime {
				t.Errorf("runtime of %q read as %q, want %q", n.Status.NodeInfo.ContainerRuntimeVersion, got, tc.wantRuntime)
			}
			got, ok := gpustack.NodeOS(n.Labels)
			if !ok {
				t.Fatalf("NFD OS labels not found in %v", n.Labels)
			}
			if diff := cmp.Diff(tc.wantOS, got); diff != "" {
				t.Errorf("OS (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGPUNodes(t *testing.T) {
	tests := map[string]struct {
		n, pools  int
		wantPools []string
	}{
		"none":                     {n: 0, pools: 2, wantPools: []string{}},
		"round robin over pools":   {n: 5, pools: 2, wantPools: []string{"pool-a", "pool-b", "pool-a", "pool-b", "pool-a"}},
		"more pools than nodes":    {n: 2, pools: 4, wantPools: []string{"pool-a", "pool-b"}},
		"zero pools: one":          {n: 3, pools: 0, wantPools: []string{"pool-a", "pool-a", "pool-a"}},
		"negative pools: one":      {n: 2, pools: -3, wantPools: []string{"pool-a", "pool-a"}},
		"one pool per node (z)":    {n: 26, pools: 26},
		"three digits in the name": {n: 101, pools: 3},
		"more than 26 pools":       {n: 30, pools: 30},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			specs := devcluster.GPUNodes(tc.n, tc.pools)
			if len(specs) != tc.n {
				t.Fatalf("%d specs, want %d", len(specs), tc.n)
			}
			pools := []string{}
			names := map[string]bool{}
			for i, s := range specs {
				if want := fmt.Sprintf("gpu-%03d", i); s.Name != want {
					t.Errorf("spec %d named %q, want %q", i, s.Name, want)
				}
				names[s.Name] = true
				if s.GPUs != 8 || s.OSID != "" || s.Runtime != "" {
					t.Errorf("spec %s: %d GPUs, OS %q, runtime %q; want 8 GPUs and the defaults", s.Name, s.GPUs, s.OSID, s.Runtime)
				}
				if errs := validation.IsValidLabelValue(s.Pool); len(errs) > 0 {
					t.Errorf("spec %s: pool %q is not a valid label value: %v", s.Name, s.Pool, errs)
				}
				pools = append(pools, s.Pool)
			}
			if len(names) != tc.n {
				t.Errorf("%d distinct names for %d nodes", len(names), tc.n)
			}
			if tc.wantPools != nil {
				if diff := cmp.Diff(tc.wantPools, pools); diff != "" {
					t.Errorf("pools (-want +got):\n%s", diff)
				}
				return
			}
			distinct := slices.Compact(slices.Sorted(slices.Values(pools)))
			if want := min(tc.n, max(tc.pools, 1)); len(distinct) != want {
				t.Errorf("%d distinct pools %v, want %d", len(distinct), distinct, want)
			}
		})
	}
}

// simNode is a simulated node as a test left it: with the kubelet's own
// conditions and injected ones, labels and the fixed-by annotation.
func simNode(fixedBy string, labels map[string]string, injected ...corev1.NodeConditionType) *corev1.Node {
	n := devcluster.NodeSpec{Name: "gpu-sim", Pool: "a", GPUs: 8, Labels: labels}.Node()
	if fixedBy != "" {
		n.Annotations[devcluster.AnnotationFixedBy] = fixedBy
	}
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse},
		{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse},
	}
	for _, c := range injected {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: corev1.ConditionTrue, Reason: "Injected"})
	}
	return n
}

func conditionTypes(n *corev1.Node) []string {
	var out []string
	for _, c := range n.Status.Conditions {
		out = append(out, string(c.Type)+"="+string(c.Status))
	}
	slices.Sort(out)
	return out
}

// writes lists the fake clientset's writes as "verb resource[/subresource]".
func writes(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		if a.GetVerb() == "get" || a.GetVerb() == "list" || a.GetVerb() == "watch" {
			continue
		}
		r := a.GetResource().Resource
		if a.GetSubresource() != "" {
			r += "/" + a.GetSubresource()
		}
		out = append(out, a.GetVerb()+" "+r)
	}
	return out
}

// TestSimExecutorFixedBy drives SimExecutor against a fake clientset: an
// action listed in the node's fixed-by annotation clears the injected
// conditions, unfreezes the node and restarts a stopped kubelet; any other
// action changes nothing (but a reboot still reboots).
func TestSimExecutorFixedBy(t *testing.T) {
	standard := []string{"DiskPressure=False", "MemoryPressure=False", "NetworkUnavailable=False", "PIDPressure=False"}
	with := func(extra ...string) []string {
		return slices.Sorted(slices.Values(append(slices.Clone(standard), extra...)))
	}
	frozen := map[string]string{devcluster.LabelFrozen: "true"}
	stopped := map[string]string{devcluster.LabelKubelet: "stopped"}
	tests := map[string]struct {
		node           *corev1.Node
		action         repairv1.Action
		wantConditions []string
		wantLabels     map[string]string // of the sim labels: frozen, kubelet
		wantNewBootID  bool
		wantNoWrite    bool
	}{
		"listed: injected conditions cleared, the kubelet's kept": {
			node: simNode("RestartKubelet,RestartNTP", nil, "NTPProblem", "ReadonlyFilesystem"), action: repairv1.ActionRestartNTP,
			wantConditions: with("Ready=True"), wantLabels: map[string]string{},
		},
		"not listed: nothing changes": {
			node: simNode("Reboot", nil, "NTPProblem"), action: repairv1.ActionRestartNTP,
			wantConditions: with("NTPProblem=True", "Ready=True"), wantLabels: map[string]string{}, wantNoWrite: true,
		},
		"no annotation: nothing changes": {
			node: simNode("", frozen, "ReadonlyFilesystem"), action: repairv1.ActionRestartKubelet,
			wantConditions: with("ReadonlyFilesystem=True", "Ready=True"), wantLabels: map[string]string{devcluster.LabelFrozen: "true"}, wantNoWrite: true,
		},
		"a prefix of a listed action does not count": {
			node: simNode("RestartKubeletAndMore", nil, "NTPProblem"), action: repairv1.ActionRestartKubelet,
			wantConditions: with("NTPProblem=True", "Ready=True"), wantLabels: map[string]string{}, wantNoWrite: true,
		},
		"listed: a frozen node is unfrozen": {
			node: simNode("RestartKubelet", frozen), action: repairv1.ActionRestartKubelet,
			wantConditions: with("Ready=True"), wantLabels: map[string]string{},
		},
		"listed: a stopped kubelet is started": {
			node: simNode("RestartContainerRuntime", stopped), action: repairv1.ActionRestartContainerRuntime,
			wantConditions: with("Ready=True"), wantLabels: map[string]string{},
		},
		"reboot listed: new boot ID, faults cleared, unfrozen": {
			node: simNode("Reboot", nil, "ReadonlyFilesystem"), action: repairv1.ActionReboot,
			// Ready=False is what the reboot's downtime wrote; kwok (not
			// running here) makes the unfrozen node Ready again.
			wantConditions: with("Ready=False"), wantLabels: map[string]string{}, wantNewBootID: true,
		},
		"reboot not listed: new boot ID, the fault stays": {
			node: simNode("RestartNTP", nil, "ReadonlyFilesystem"), action: repairv1.ActionReboot,
			wantConditions: with("ReadonlyFilesystem=True", "Ready=False"), wantLabels: map[string]string{}, wantNewBootID: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cs := fake.NewClientset(tc.node.DeepCopy())
			exec := devcluster.SimExecutor{Cluster: &devcluster.Cluster{Client: cs}, RebootDowntime: time.Millisecond}
			if err := exec.Execute(t.Context(), tc.node, tc.action, nil); err != nil {
				t.Fatal(err)
			}
			got, err := cs.CoreV1().Nodes().Get(t.Context(), tc.node.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantConditions, conditionTypes(got)); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			sim := map[string]string{}
			for _, k := range []string{devcluster.LabelFrozen, devcluster.LabelKubelet} {
				if v, ok := got.Labels[k]; ok {
					sim[k] = v
				}
			}
			if diff := cmp.Diff(tc.wantLabels, sim); diff != "" {
				t.Errorf("simulation labels (-want +got):\n%s", diff)
			}
			if newBoot := got.Status.NodeInfo.BootID != tc.node.Status.NodeInfo.BootID; newBoot != tc.wantNewBootID {
				t.Errorf("new boot ID: %t, want %t", newBoot, tc.wantNewBootID)
			}
			if w := writes(cs); tc.wantNoWrite && len(w) > 0 {
				t.Errorf("writes %v, want none", w)
			}
			if got.Labels[devcluster.LabelPool] != "a" || got.Annotations[devcluster.AnnotationFixedBy] != tc.node.Annotations[devcluster.AnnotationFixedBy] {
				t.Errorf("other labels or annotations changed: %v %v", got.Labels, got.Annotations)
			}
		})
	}
}

// TestSimExecutorReportsWriteErrors: a failed write is the action's error
// (the agent records it as Failed).
func TestSimExecutorReportsWriteErrors(t *testing.T) {
	node := simNode("RestartNTP", nil, "NTPProblem")
	cs := fake.NewClientset(node.DeepCopy())
	cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("etcdserver: request timed out")
	})
	err := devcluster.SimExecutor{Cluster: &devcluster.Cluster{Client: cs}}.Execute(context.Background(), node, repairv1.ActionRestartNTP, nil)
	if err == nil {
		t.Fatal("a failed write: want an error")
	}
	if want := "clearing condition NTPProblem on node gpu-sim: etcdserver: request timed out"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}

// TestSetNodeConditionPatchesOnlyThatCondition: the patch the fault
// injection sends is a strategic merge of one condition (other conditions
// are kept), with times set when the caller left them zero.
func TestSetNodeConditionPatchesOnlyThatCondition(t *testing.T) {
	node := simNode("", nil, "NTPProblem")
	cs := fake.NewClientset(node.DeepCopy())
	c := &devcluster.Cluster{Client: cs}
	set := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := c.SetNodeCondition(t.Context(), node.Name, corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue,
		LastTransitionTime: metav1.NewTime(set)}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetNodeCondition(t.Context(), node.Name, corev1.NodeCondition{Type: "NTPProblem", Status: corev1.ConditionFalse}); err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().Nodes().Get(t.Context(), node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"DiskPressure=False", "MemoryPressure=False", "NTPProblem=False", "NetworkUnavailable=False", "PIDPressure=False",
		"ReadonlyFilesystem=True", "Ready=True"}
	if diff := cmp.Diff(want, conditionTypes(got)); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	for _, cond := range got.Status.Conditions {
		switch cond.Type {
		case "ReadonlyFilesystem":
			if !cond.LastTransitionTime.Equal(&metav1.Time{Time: set}) || cond.LastHeartbeatTime.IsZero() {
				t.Errorf("ReadonlyFilesystem times %v / %v: want the given transition time and a heartbeat", cond.LastTransitionTime, cond.LastHeartbeatTime)
			}
		case "NTPProblem":
			if cond.LastTransitionTime.IsZero() || cond.LastHeartbeatTime.IsZero() {
				t.Errorf("NTPProblem without times: %+v", cond)
			}
		}
	}
	if got.Labels[devcluster.LabelFrozen] != "" {
		t.Errorf("a non-Ready condition froze the node")
	}
	// Ready freezes the node; clearing Ready unfreezes it and leaves the
	// injected condition in place.
	if err := c.SetNodeCondition(t.Context(), node.Name, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse}); err != nil {
		t.Fatal(err)
	}
	if got, _ = cs.CoreV1().Nodes().Get(t.Context(), node.Name, metav1.GetOptions{}); got.Labels[devcluster.LabelFrozen] != "true" {
		t.Errorf("injected Ready=False without freezing the node: labels %v", got.Labels)
	}
	if err := c.ClearNodeCondition(t.Context(), node.Name, corev1.NodeReady); err != nil {
		t.Fatal(err)
	}
	if got, _ = cs.CoreV1().Nodes().Get(t.Context(), node.Name, metav1.GetOptions{}); got.Labels[devcluster.LabelFrozen] != "" {
		t.Errorf("ClearNodeCondition(Ready) left the node frozen: labels %v", got.Labels)
	}
	if !slices.Contains(conditionTypes(got), "ReadonlyFilesystem=True") {
		t.Errorf("clearing Ready removed another condition: %v", conditionTypes(got))
	}
	// The errors name the node and the condition.
	if err := c.SetNodeCondition(t.Context(), "missing", corev1.NodeCondition{Type: "NTPProblem", Status: corev1.ConditionTrue}); err == nil {
		t.Errorf("a condition on a missing node: want an error")
	} else if want := `setting condition NTPProblem on node missing: nodes "missing" not found`; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}
