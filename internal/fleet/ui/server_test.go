package ui

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufleet/gpufleet/internal/fleet"
)

// testServer is a view whose state is set by hand (no cluster).
func testServer(rows ...fleet.Row) *Server {
	s := &Server{rows: map[string][]byte{}, subs: map[chan []byte]struct{}{}, ready: make(chan struct{})}
	f := &fleet.Fleet{Rows: rows, Summary: fleet.Summarize(rows)}
	s.current = f
	close(s.ready)
	return s
}

func TestHandlerIsReadOnlyAndLoopbackOnly(t *testing.T) {
	h := testServer().Handler(true)
	tests := map[string]struct {
		method, host, path string
		want               int
	}{
		"the page":                     {http.MethodGet, "127.0.0.1:8090", "/", http.StatusOK},
		"the page as localhost":        {http.MethodGet, "localhost:8090", "/", http.StatusOK},
		"the page over IPv6":           {http.MethodGet, "[::1]:8090", "/", http.StatusOK},
		"a static file":                {http.MethodGet, "127.0.0.1:8090", "/static/app.js", http.StatusOK},
		"another host (DNS rebinding)": {http.MethodGet, "evil.example.com:8090", "/", http.StatusForbidden},
		"a write":                      {http.MethodPost, "127.0.0.1:8090", "/api/events", http.StatusMethodNotAllowed},
		"a delete":                     {http.MethodDelete, "127.0.0.1:8090", "/", http.StatusMethodNotAllowed},
		"explain without a node":       {http.MethodGet, "127.0.0.1:8090", "/api/explain", http.StatusBadRequest},
		"an unknown path":              {http.MethodGet, "127.0.0.1:8090", "/etc/passwd", http.StatusNotFound},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "http://"+tc.host+tc.path, nil)
			r.Host = tc.host
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Errorf("%s %s (Host %s): %d, want %d", tc.method, tc.path, tc.host, w.Code, tc.want)
			}
			if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
		})
	}
}

func TestPageHasNoInlineScriptAndNoData(t *testing.T) {
	w := httptest.NewRecorder()
	testServer().Handler(true).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil))
	body := w.Body.String()
	if strings.Contains(body, "<script>") || !strings.Contains(body, `<script src="/static/app.js"`) {
		t.Errorf("the page must load its script from /static only:\n%s", body)
	}
	if !strings.Contains(body, `class="swatch state-in-maintenance"`) {
		t.Errorf("the legend lacks the state classes:\n%s", body)
	}
	js := httptest.NewRecorder()
	testServer().Handler(true).ServeHTTP(js, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/static/app.js", nil))
	if strings.Contains(js.Body.String(), "innerHTML") || strings.Contains(js.Body.String(), "insertAdjacentHTML") {
		t.Error("app.js must write cluster data with textContent only")
	}
}

func TestEventsStreamSnapshotThenUpdates(t *testing.T) {
	s := testServer(fleet.Row{Node: "gpu-000", State: fleet.StateReady})
	srv := httptest.NewServer(s.Handler(true))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	lines := bufio.NewScanner(resp.Body)
	next := func() string {
		for lines.Scan() {
			if l := lines.Text(); strings.HasPrefix(l, "event: ") {
				lines.Scan()
				return strings.TrimPrefix(l, "event: ") + " " + lines.Text()
			}
		}
		t.Fatalf("stream ended: %v", lines.Err())
		return ""
	}
	if got := next(); !strings.HasPrefix(got, "snapshot ") || !strings.Contains(got, `"node":"gpu-000"`) {
		t.Errorf("first event %q, want the snapshot", got)
	}
	// A change reaches the page as an update.
	s.broadcast(event("update", update{Changed: nil, Removed: []string{"gpu-001"}}))
	if got := next(); !strings.HasPrefix(got, "update ") || !strings.Contains(got, `"removed":["gpu-001"]`) {
		t.Errorf("second event %q, want the update", got)
	}
}

func TestTrim(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"big": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "i", Env: []corev1.EnvVar{{Name: "SECRET", Value: "s"}},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{fleet.ResourceGPU: *resourceQuantity("2")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Message: "m", ContainerStatuses: []corev1.ContainerStatus{{Name: "c"}}},
	}
	out, err := fleet.Trim(p)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Pod)
	if got.ManagedFields != nil || got.Annotations != nil || got.Spec.Containers[0].Env != nil || got.Spec.Containers[0].Image != "" ||
		got.Status.ContainerStatuses != nil || got.Status.Message != "" {
		t.Errorf("trim kept what the view does not read: %+v", got)
	}
	if got.Spec.NodeName != "n" || got.Labels["a"] != "b" || got.Status.Phase != corev1.PodRunning {
		t.Errorf("trim dropped what the view reads: %+v", got)
	}
	if q := got.Spec.Containers[0].Resources.Requests[fleet.ResourceGPU]; q.Value() != 2 {
		t.Errorf("GPU request %v, want 2", q)
	}
}

func resourceQuantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// TestHeartbeatRebuildsNothing: a node's status heartbeat, or a resync,
// does not mark the view dirty (each rebuild reads every node and pod);
// a change the view shows does.
func TestHeartbeatRebuildsNothing(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	node := func(rv string, heartbeat metav1.Time, ready corev1.ConditionStatus, unschedulable bool) any {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-000", ResourceVersion: rv,
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}},
			Spec: corev1.NodeSpec{Unschedulable: unschedulable},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready,
				LastHeartbeatTime: heartbeat, LastTransitionTime: t0}}}}
		out, err := fleet.Trim(n)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	later := metav1.NewTime(t0.Add(5 * time.Minute))
	before := node("1", t0, corev1.ConditionTrue, false)
	tests := map[string]struct {
		cur   any
		dirty bool
	}{
		"status heartbeat":  {node("2", later, corev1.ConditionTrue, false), false},
		"resync":            {node("1", t0, corev1.ConditionTrue, false), false},
		"node not Ready":    {node("2", later, corev1.ConditionFalse, false), true},
		"node cordoned":     {node("2", t0, corev1.ConditionTrue, true), true},
		"not a Kube object": {"x", true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := &Server{dirty: make(chan struct{}, 1)}
			s.updated(before, tc.cur)
			if got := len(s.dirty) == 1; got != tc.dirty {
				t.Errorf("view marked dirty: %v, want %v", got, tc.dirty)
			}
		})
	}
	// trim leaves the cache's object as the view reads it: the heartbeat
	// time is gone, the condition stays.
	n := node("3", later, corev1.ConditionTrue, false).(*corev1.Node)
	if c := n.Status.Conditions[0]; !c.LastHeartbeatTime.IsZero() || c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("trimmed condition %+v", c)
	}
}
