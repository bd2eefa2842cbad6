package gpustack

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func v16Policy(t *testing.T) *nvidiav1.ClusterPolicy {
	t.Helper()
	data, err := os.ReadFile("testdata/gpu-operator-1.6-clusterpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := &nvidiav1.ClusterPolicy{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		t.Fatalf("the GPU Operator 1.6 ClusterPolicy does not fit the API types: %v", err)
	}
	return p
}

// renderYAML renders and serialises the objects, for golden comparison.
func renderYAML(t *testing.T, p *nvidiav1.ClusterPolicy, facts Facts) string {
	t.Helper()
	objs, err := Render(p, facts, Assets)
	if err != nil {
		t.Fatal(err)
	}
	if sm := RenderServiceMonitor(p, facts.Namespace); sm != nil {
		objs = append(objs, sm)
	}
	var b strings.Builder
	for _, o := range objs {
		data, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n# " + kindOf(o) + " " + o.GetName() + "\n")
		b.Write(data)
	}
	return b.String()
}

func kindOf(o client.Object) string {
	if u, ok := o.(*unstructured.Unstructured); ok {
		return u.GetKind()
	}
	return reflect.TypeOf(o).Elem().Name()
}

func TestRenderGolden(t *testing.T) {
	mixed := Facts{Namespace: "gpu-operator",
		OSFlavours: []OSFlavour{{"ubuntu", "22.04"}, {"ubuntu", "20.04"}, {"rhel", "9.4"}},
		Runtimes:   []string{"containerd", "docker"}}
	tests := map[string]struct {
		policy func(t *testing.T) *nvidiav1.ClusterPolicy
		facts  Facts
	}{
		"v1.6":                       {policy: v16Policy, facts: Facts{Namespace: "gpu-operator", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}}, Runtimes: []string{"containerd"}}},
		"v1.6-mixed-os-and-runtimes": {policy: v16Policy, facts: mixed},
		"chart-default":              {policy: chartDefaultPolicy, facts: mixed},
		"common-options":             {policy: commonOptionsPolicy, facts: Facts{Namespace: "gpu-operator", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}}, Runtimes: []string{"containerd"}}},
		"defaults-all-optional-on": {policy: func(*testing.T) *nvidiav1.ClusterPolicy {
			p := &nvidiav1.ClusterPolicy{}
			p.Name, p.UID = "cluster-policy", "uid-1"
			p.Spec.DCGM.Enabled = ptr.To(true)
			p.Spec.MIGManager.Enabled = ptr.To(true)
			p.Spec.NodeStatusExporter.Enabled = ptr.To(true)
			p.Spec.Daemonsets.PriorityClassName = "gpu-critical"
			p.Spec.Driver.Version = "sha256:0123456789abcdef"
			return p
		}, facts: mixed},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := renderYAML(t, tc.policy(t), tc.facts)
			path := filepath.Join("testdata", "golden", name+".yaml")
			if *update {
				_ = os.MkdirAll(filepath.Dir(path), 0o755)
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/gpustack -run TestRenderGolden -update)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("render differs from %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

func TestRenderPerOSAndRuntime(t *testing.T) {
	p := v16Policy(t)
	objs, err := Render(p, Facts{Namespace: "ns", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}, {"rhel", "9.4"}}, Runtimes: []string{"docker", "containerd"}}, Assets)
	if err != nil {
		t.Fatal(err)
	}
	images := map[string]string{}
	env := map[string]map[string]string{}
	for _, o := range objs {
		ds, ok := o.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		images[ds.Name] = ds.Spec.Template.Spec.Containers[0].Image
		env[ds.Name] = map[string]string{}
		for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
			env[ds.Name][e.Name] = e.Value
		}
	}
	want := map[string]string{
		"nvidia-driver-daemonset-ubuntu22.04": "registry.cn-beijing.aliyuncs.com/happy365/nvidia-driver:450.102.04-ubuntu22.04",
		"nvidia-driver-daemonset-rhel9.4":     "registry.cn-beijing.aliyuncs.com/happy365/nvidia-driver:450.102.04-rhel9.4",
	}
	for ds, img := range want {
		if images[ds] != img {
			t.Errorf("%s image = %q, want %q", ds, images[ds], img)
		}
	}
	if env["nvidia-container-toolkit-daemonset-docker"]["RUNTIME"] != "docker" || env["nvidia-container-toolkit-daemonset-docker"]["DOCKER_SOCKET"] == "" {
		t.Errorf("docker toolkit env: %v", env["nvidia-container-toolkit-daemonset-docker"])
	}
	if env["nvidia-container-toolkit-daemonset-containerd"]["RUNTIME"] != "containerd" || env["nvidia-container-toolkit-daemonset-containerd"]["CONTAINERD_CONFIG"] == "" {
		t.Errorf("containerd toolkit env: %v", env["nvidia-container-toolkit-daemonset-containerd"])
	}
	// Off-by-default components are absent; disabling one removes it.
	for name := range images {
		if strings.Contains(name, "mig-manager") || strings.Contains(name, "node-status") || name == "nvidia-dcgm" {
			t.Errorf("off-by-default component rendered: %s", name)
		}
	}
	p.Spec.GFD.Enabled = ptr.To(false)
	objs, _ = Render(p, Facts{Namespace: "ns"}, Assets)
	for _, o := range objs {
		if o.GetLabels()[LabelComponent] == GFD {
			t.Errorf("disabled gfd still rendered: %s", o.GetName())
		}
	}
}

func TestRenderMalformedAssetIsAnError(t *testing.T) {
	broken := fstest.MapFS{}
	for _, c := range nvidiav1.Components {
		broken[c.Key+".yaml"] = &fstest.MapFile{Data: []byte("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\n")}
	}
	tests := map[string]string{
		"not yaml":      "{{{{",
		"unknown kind":  "apiVersion: v1\nkind: Frobnicator\nmetadata:\n  name: x\n",
		"unknown field": "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  bogus: 1\n",
		"no containers": "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec: {}\n",
		"empty":         "# nothing\n",
	}
	for name, doc := range tests {
		t.Run(name, func(t *testing.T) {
			fs := fstest.MapFS{}
			for k, v := range broken {
				fs[k] = v
			}
			fs[Driver+".yaml"] = &fstest.MapFile{Data: []byte(doc)}
			_, err := Render(&nvidiav1.ClusterPolicy{}, Facts{Namespace: "ns", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}}}, fs)
			if err == nil || !strings.Contains(err.Error(), "driver") {
				t.Errorf("got %v, want an error naming the driver component", err)
			}
		})
	}
	fs := fstest.MapFS{}
	if _, err := Render(&nvidiav1.ClusterPolicy{}, Facts{}, fs); err == nil {
		t.Errorf("missing assets rendered without error")
	}
}
