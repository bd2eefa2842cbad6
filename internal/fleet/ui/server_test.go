package ui

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
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
// queues nothing; a change the view shows queues the node whose row it
// changes (both nodes of an update), the config the whole view.
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
	pod := func(node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "job", ResourceVersion: "7"}, Spec: corev1.PodSpec{NodeName: node}}
	}
	bound := pod("gpu-001")
	bound.ResourceVersion = "8"
	tests := map[string]struct {
		old, cur any
		want     []string
	}{
		"status heartbeat":                  {before, node("2", later, corev1.ConditionTrue, false), nil},
		"resync":                            {before, node("1", t0, corev1.ConditionTrue, false), nil},
		"node not Ready":                    {before, node("2", later, corev1.ConditionFalse, false), []string{"gpu-000"}},
		"node cordoned":                     {before, node("2", t0, corev1.ConditionTrue, true), []string{"gpu-000"}},
		"a pod created, not yet bound":      {nil, pod(""), nil},
		"a pod bound to its node":           {pod(""), bound, []string{"gpu-001"}},
		"a pod deleted":                     {nil, toolscache.DeletedFinalStateUnknown{Obj: bound}, []string{"gpu-001"}},
		"a fault of a GPU":                  {nil, &repairv1.GPUFault{Spec: repairv1.GPUFaultSpec{NodeName: "gpu-002"}}, []string{"gpu-002"}},
		"the config: every row may change":  {nil, &maintenancev1.MaintenanceOperatorConfig{}, []string{everything}},
		"not a Kube object: the whole view": {before, "x", []string{"gpu-000", everything}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := touched(tc.old, tc.cur); !slices.Equal(got, tc.want) {
				t.Errorf("queued %q, want %q", got, tc.want)
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

// TestAChangeBuildsOnlyTheRowsItTouches: after the whole view, a change
// of one node builds one row and sends it alone; the summary, kept by
// taking the old row out and counting the new one in, equals the one of
// the whole view counted again; a node that appears takes its place in
// the order, one that is gone is removed; with domains the rows stay
// grouped. The whole view is built again only when asked.
func TestAChangeBuildsOnlyTheRowsItTouches(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	node := func(name, domain string, unschedulable bool) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{fleet.DefaultPoolLabel: "pool-a", "clique": domain}},
			Spec: corev1.NodeSpec{Unschedulable: unschedulable},
			Status: corev1.NodeStatus{Capacity: corev1.ResourceList{fleet.ResourceGPU: resource.MustParse("8")},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
		if domain == "" {
			delete(n.Labels, "clique")
		}
		return n
	}
	config := &maintenancev1.MaintenanceOperatorConfig{Spec: maintenancev1.MaintenanceOperatorConfigSpec{
		Domains: &maintenancev1.MaintenanceDomains{NodeLabel: "clique"}}}
	for _, withDomains := range []bool{false, true} {
		t.Run(fmt.Sprintf("domains %v", withDomains), func(t *testing.T) {
			domain := func(d string) string {
				if withDomains {
					return d
				}
				return ""
			}
			snap := func(nodes ...*corev1.Node) *fleet.Snapshot {
				s := &fleet.Snapshot{Nodes: nodes}
				if withDomains {
					s.Config = config
				}
				return s
			}
			all := []*corev1.Node{}
			for i := range 50 {
				all = append(all, node(fmt.Sprintf("gpu-%03d", i), domain(fmt.Sprintf("rack-%d", i%3)), false))
			}
			s := &Server{opts: Options{Clock: clocktesting.NewFakeClock(now)}, pos: map[string]int{}, rows: map[string][]byte{},
				subs: map[chan []byte]struct{}{}, ready: make(chan struct{}),
				queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
			defer s.queue.ShutDown()
			_, updates := s.subscribe()
			next := func() update {
				t.Helper()
				var u update
				select {
				case msg := <-updates:
					data := strings.TrimSuffix(strings.SplitN(string(msg), "data: ", 2)[1], "\n\n")
					if err := json.Unmarshal([]byte(data), &u); err != nil {
						t.Fatal(err)
					}
				default:
					t.Fatal("no update sent")
				}
				return u
			}
			check := func(what string, nodes []*corev1.Node) {
				t.Helper()
				want := fleet.Build(snap(nodes...), now)
				if d := cmp.Diff(want.Rows, s.current.Rows); d != "" {
					t.Errorf("%s: rows differ from the whole view built again (-want +got):\n%s", what, d)
				}
				if d := cmp.Diff(want.Summary, s.current.Summary); d != "" {
					t.Errorf("%s: summary (-want +got):\n%s", what, d)
				}
				if d := cmp.Diff(want.Domains, s.current.Domains); d != "" {
					t.Errorf("%s: domains (-want +got):\n%s", what, d)
				}
			}
			if err := s.apply(fleet.Build(snap(all...), now), nil); err != nil {
				t.Fatal(err)
			}
			if u := next(); len(u.Changed) != 50 || s.RowsBuilt() != 50 {
				t.Fatalf("the first view: %d rows sent, %d built; want 50", len(u.Changed), s.RowsBuilt())
			}
			check("first view", all)

			// One node cordoned: one row built, one sent.
			all[7] = node("gpu-007", domain("rack-1"), true)
			if err := s.apply(fleet.Build(snap(all[7]), now), []string{"gpu-007"}); err != nil {
				t.Fatal(err)
			}
			if u := next(); len(u.Changed) != 1 || !strings.Contains(string(u.Changed[0]), `"node":"gpu-007"`) || u.Summary.Cordoned != 1 || s.RowsBuilt() != 51 {
				t.Errorf("a cordon: %d rows sent (%s), cordoned %d, %d built; want gpu-007's row alone, 1, 51", len(u.Changed), u.Changed, u.Summary.Cordoned, s.RowsBuilt())
			}
			check("a cordon", all)

			// A node moved to another domain, a node added, a node gone.
			all[8] = node("gpu-008", domain("rack-0"), false) // from rack-2
			wantSent := 1                                     // the node added
			if withDomains {
				wantSent = 2
			}
			added := node("gpu-0075", domain("rack-0"), false)
			if err := s.apply(fleet.Build(snap(all[8], added), now), []string{"gpu-008", "gpu-0075", "gpu-049"}); err != nil {
				t.Fatal(err)
			}
			u := next()
			if len(u.Changed) != wantSent || !slices.Equal(u.Removed, []string{"gpu-049"}) {
				t.Errorf("moved, added, gone: %d rows sent, removed %v; want %d and gpu-049", len(u.Changed), u.Removed, wantSent)
			}
			all = append(all[:49], added)
			check("moved, added, gone", all)

			// A change that changes nothing shown sends nothing.
			if err := s.apply(fleet.Build(snap(all[3]), now), []string{"gpu-003"}); err != nil {
				t.Fatal(err)
			}
			select {
			case msg := <-updates:
				t.Errorf("an unchanged row was sent: %s", msg)
			default:
			}
			// Everything again: the same view.
			if err := s.apply(fleet.Build(snap(all...), now), nil); err != nil {
				t.Fatal(err)
			}
			check("everything again", all)
		})
	}
}
