package fleet

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// pagingReader serves a list asked with a limit in pages, as the API
// server does, and records the limits asked for, by list type.
type pagingReader struct {
	client.Reader
	mu     sync.Mutex // Load lists its types in parallel
	limits map[string][]int64
}

func (p *pagingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := &client.ListOptions{}
	o.ApplyOptions(opts)
	kind := fmt.Sprintf("%T", list)
	p.mu.Lock()
	p.limits[kind] = append(p.limits[kind], o.Limit)
	p.mu.Unlock()
	// (The fake client cannot filter by the phase selectors Load asks
	// for: every pod here is running.)
	if err := p.Reader.List(ctx, list, &client.ListOptions{Namespace: o.Namespace, LabelSelector: o.LabelSelector}); err != nil || o.Limit == 0 {
		return err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	from := 0
	if o.Continue != "" {
		if from, err = strconv.Atoi(o.Continue); err != nil {
			return err
		}
	}
	to := min(from+int(o.Limit), len(items))
	if err := meta.SetList(list, items[from:to]); err != nil {
		return err
	}
	if to < len(items) {
		list.SetContinue(strconv.Itoa(to))
	}
	return nil
}

// TestLoadListsPodsAndNodesInTrimmedPages: the largest lists come in
// pages of listPage, every object trimmed before the next page (at 3,000
// nodes and 27,000 pods that cut the peak memory of `gpufleet status` by
// a third), and nothing is lost between pages.
func TestLoadListsPodsAndNodesInTrimmedPages(t *testing.T) {
	const nodes, podsPerNode = 3, 401 // 1,203 pods: three pages
	var objs []runtime.Object
	for n := range nodes {
		name := fmt.Sprintf("gpu-%d", n)
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"big": "x"}},
			Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"registry.example/cuda:12"}}}}})
		for i := range podsPerNode {
			objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: fmt.Sprintf("%s-%d", name, i)},
				Spec: corev1.PodSpec{NodeName: name, Containers: []corev1.Container{{Name: "main", Image: "registry.example/train:1",
					Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "main"}}}})
		}
	}
	r := &pagingReader{Reader: fake.NewClientBuilder().WithScheme(Scheme()).WithRuntimeObjects(objs...).Build(), limits: map[string][]int64{}}
	s, err := Load(t.Context(), r, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Pods) != nodes*podsPerNode || len(s.Nodes) != nodes {
		t.Fatalf("loaded %d pods and %d nodes, want %d and %d", len(s.Pods), len(s.Nodes), nodes*podsPerNode, nodes)
	}
	seen := map[string]bool{}
	for _, p := range s.Pods {
		if seen[p.Name] {
			t.Fatalf("pod %s loaded twice", p.Name)
		}
		seen[p.Name] = true
		if p.Spec.Containers[0].Image != "" || p.Spec.Containers[0].Env != nil || p.Status.ContainerStatuses != nil {
			t.Fatalf("pod %s kept what the view does not read: %+v", p.Name, p.Spec.Containers[0])
		}
	}
	for _, n := range s.Nodes {
		if n.Annotations != nil || n.Status.Images != nil {
			t.Fatalf("node %s kept what the view does not read", n.Name)
		}
	}
	if got := r.limits["*v1.PodList"]; len(got) != 3 || got[0] != listPage {
		t.Errorf("pod lists asked with limits %v, want three pages of %d", got, listPage)
	}
	if got := r.limits["*v1.NodeList"]; len(got) != 1 || got[0] != listPage {
		t.Errorf("node lists asked with limits %v, want one page of %d", got, listPage)
	}
}
