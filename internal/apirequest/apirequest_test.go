package apirequest

import (
	"net/http"
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestDescribe(t *testing.T) {
	cases := []struct{ method, url, verb, resource string }{
		{"GET", "/api/v1/pods", "LIST", "pods"},
		{"GET", "/api/v1/pods?watch=true&resourceVersion=5", "WATCH", "pods"},
		{"GET", "/api/v1/namespaces/default/pods", "LIST", "pods"},
		{"GET", "/api/v1/namespaces/default/pods/p1", "GET", "pods"},
		{"POST", "/api/v1/namespaces/default/pods/p1/eviction", "POST", "pods/eviction"},
		{"PATCH", "/api/v1/nodes/n1", "PATCH", "nodes"},
		{"PUT", "/apis/maintenance.nvidia.com/v1alpha1/namespaces/x/nodemaintenances/a/status", "PUT", "nodemaintenances/status"},
		{"GET", "/api/v1/namespaces/kube-system", "GET", "namespaces"},
		{"GET", "/api/v1/namespaces", "LIST", "namespaces"},
		{"GET", "/apis/coordination.k8s.io/v1/namespaces/s/leases/l", "GET", "leases"},
		{"GET", "/version", "GET", "/version"},
		{"GET", "/apis/apps/v1", "GET", "/apis/apps/v1"},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, c.url, nil)
		verb, res := Describe(r)
		if verb != c.verb || res != c.resource {
			t.Errorf("%s %s: got %q %q, want %q %q", c.method, c.url, verb, res, c.verb, c.resource)
		}
	}
}

func TestWrapCountsWithStatusCode(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
	}))
	defer srv.Close()
	type key struct {
		verb, res string
		code      int
	}
	got := map[key]int{}
	cfg := Wrap(&rest.Config{Host: srv.URL}, func(v, r string, code int) { got[key{v, r, code}]++ })
	cs := kubernetes.NewForConfigOrDie(cfg)
	_, _ = cs.CoreV1().Nodes().Get(t.Context(), "n1", metav1.GetOptions{})
	if got[key{"GET", "nodes", 404}] != 1 {
		t.Fatalf("counts %v", got)
	}
}
