package gpustack_test

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/gpufleet/gpufleet/config"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// generatedRules reads config/rbac/role.yaml: the rules of the operator's
// ClusterRole and of its namespaced Role.
func generatedRules(t *testing.T) (cluster, namespaced []rbacv1.PolicyRule) {
	t.Helper()
	data, err := config.RBAC.ReadFile("rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var doc struct {
			metav1.TypeMeta `json:",inline"`
			Rules           []rbacv1.PolicyRule `json:"rules"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return cluster, namespaced
		} else if err != nil {
			t.Fatal(err)
		}
		switch doc.Kind {
		case "ClusterRole":
			cluster = doc.Rules
		case "Role":
			namespaced = doc.Rules
		}
	}
}

// allows reports whether rules grant verb on resource, for the object
// named name ("" = any object, as for create and list).
func allows(rules []rbacv1.PolicyRule, gr schema.GroupResource, verb, name string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, gr.Group) && slices.Contains(r.Resources, gr.Resource) && slices.Contains(r.Verbs, verb) &&
			(len(r.ResourceNames) == 0 || (name != "" && slices.Contains(r.ResourceNames, name))) {
			return true
		}
	}
	return false
}

// TestOperatorRBACCoversTheStack: the operator's generated rules let it
// create, update and delete every object of the GPU stack's manifests —
// the namespaced ones through the Role of its own namespace, the
// cluster-scoped RBAC objects through resourceNames that name exactly
// those objects — and nothing else of those kinds: a new ClusterRole in
// assets/ must be named in the +kubebuilder:rbac marker of setup.go.
func TestOperatorRBACCoversTheStack(t *testing.T) {
	cluster, namespaced := generatedRules(t)
	files, err := fs.Glob(gpustack.Assets, "*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no assets: %v", err)
	}
	resources := map[string]schema.GroupResource{
		"DaemonSet":          {Group: "apps", Resource: "daemonsets"},
		"ServiceAccount":     {Resource: "serviceaccounts"},
		"Service":            {Resource: "services"},
		"ClusterRole":        {Group: rbacv1.GroupName, Resource: "clusterroles"},
		"ClusterRoleBinding": {Group: rbacv1.GroupName, Resource: "clusterrolebindings"},
	}
	for _, f := range files {
		data, err := fs.ReadFile(gpustack.Assets, f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var o metav1.PartialObjectMetadata
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" {
				continue
			}
			gr, ok := resources[o.Kind]
			if !ok {
				t.Errorf("%s: kind %s: add its rules to the markers of setup.go and to this test", f, o.Kind)
				continue
			}
			rules := namespaced
			if o.Kind == "ClusterRole" || o.Kind == "ClusterRoleBinding" {
				rules = cluster
				if allows(cluster, gr, "update", "") || allows(cluster, gr, "delete", "") {
					t.Errorf("the operator may update or delete every %s: restrict it with resourceNames", o.Kind)
				}
			} else if allows(cluster, gr, "create", "") || allows(cluster, gr, "update", "") || allows(cluster, gr, "delete", "") {
				t.Errorf("the operator may write %s in every namespace: keep those writes in its namespaced Role", gr)
			}
			for _, verb := range []string{"get", "create", "update", "delete"} {
				name := o.Name
				if verb == "create" {
					name = ""
				}
				if !allows(rules, gr, verb, name) {
					t.Errorf("%s %s (%s): the generated role does not allow %s", o.Kind, o.Name, f, verb)
				}
			}
		}
	}
}

// TestOperatorRBACCoversServiceMonitors: dcgm-exporter's ServiceMonitor is
// written through the Role of the operator's namespace only, and of the
// CRDs the operator may read the ServiceMonitor, ClusterPolicy and
// NVIDIADriver ones only (a list or watch of each by name: the caches
// select them with metadata.name).
func TestOperatorRBACCoversServiceMonitors(t *testing.T) {
	cluster, namespaced := generatedRules(t)
	sm := schema.GroupResource{Group: gpustack.ServiceMonitorGVK.Group, Resource: "servicemonitors"}
	for _, verb := range []string{"get", "list", "watch", "create", "update", "delete"} {
		if !allows(namespaced, sm, verb, "") {
			t.Errorf("the namespaced Role does not allow %s of ServiceMonitors", verb)
		}
		if allows(cluster, sm, verb, "") {
			t.Errorf("the ClusterRole allows %s of ServiceMonitors in every namespace", verb)
		}
	}
	crd := schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}
	for _, verb := range []string{"get", "list", "watch"} {
		// The ServiceMonitor CRD, and the two whose served schema is
		// compared with gpufleet's (SchemaCurrent).
		for _, name := range []string{gpustack.ServiceMonitorCRD, gpustack.ClusterPolicyCRD, gpustack.NVIDIADriverCRD} {
			if !allows(cluster, crd, verb, name) {
				t.Errorf("the ClusterRole does not allow %s of CRD %s", verb, name)
			}
		}
		if allows(cluster, crd, verb, "") || allows(cluster, crd, verb, "nodemaintenances.maintenance.nvidia.com") {
			t.Errorf("the ClusterRole allows %s of other CRDs", verb)
		}
	}
	for _, verb := range []string{"create", "update", "patch", "delete"} {
		if allows(cluster, crd, verb, gpustack.ServiceMonitorCRD) {
			t.Errorf("the ClusterRole allows %s of CRDs", verb)
		}
	}
}
