package gpustack_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufleet/gpufleet/internal/gpustack"
)

type props = apiextensionsv1.JSONSchemaProps

func object(fields map[string]props) props {
	return props{Type: "object", Properties: fields}
}

func leaf() props { return props{Type: "string"} }

func arrayOf(item props) props {
	return props{Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &item}}
}

func mapOf(value props) props {
	return props{Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true, Schema: &value}}
}

func preserving(p props) props {
	p.XPreserveUnknownFields = ptr.To(true)
	return p
}

// ours is a small policy schema: a struct, a list of structs, a map of
// structs and a status.
func ours() props {
	return object(map[string]props{
		"spec": object(map[string]props{
			"driver": object(map[string]props{
				"version":          leaf(),
				"kernelModuleType": leaf(),
				"env":              arrayOf(object(map[string]props{"name": leaf(), "value": leaf()})),
				"licensing":        object(map[string]props{"configMapName": leaf(), "nlsEnabled": {Type: "boolean"}}),
			}),
			"nodeSelector": mapOf(leaf()),
			"pools":        mapOf(object(map[string]props{"size": leaf(), "zone": leaf()})),
		}),
		"status": object(map[string]props{"state": leaf(), "components": arrayOf(object(map[string]props{"name": leaf()}))}),
	})
}

// without returns a copy of s without the property at path (dots; "[]"
// an array's items, "*" a map's values).
func without(s props, path string) props {
	parts := strings.Split(path, ".")
	var walk func(p props, parts []string) props
	walk = func(p props, parts []string) props {
		if p.Properties != nil {
			p.Properties = maps.Clone(p.Properties)
		}
		name := parts[0]
		switch {
		case len(parts) == 1:
			delete(p.Properties, name)
		case name == "[]":
			item := walk(*p.Items.Schema, parts[1:])
			p.Items = &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &item}
		case name == "*":
			v := walk(*p.AdditionalProperties.Schema, parts[1:])
			p.AdditionalProperties = &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true, Schema: &v}
		default:
			p.Properties[name] = walk(p.Properties[name], parts[1:])
		}
		return p
	}
	return walk(s, parts)
}

// replace returns a copy of s with the schema at path set to with.
func replace(s props, path string, with props) props {
	parts := strings.Split(path, ".")
	var walk func(p props, parts []string) props
	walk = func(p props, parts []string) props {
		p.Properties = maps.Clone(p.Properties)
		if len(parts) == 1 {
			p.Properties[parts[0]] = with
			return p
		}
		p.Properties[parts[0]] = walk(p.Properties[parts[0]], parts[1:])
		return p
	}
	return walk(s, parts)
}

func TestMissingFields(t *testing.T) {
	for name, tc := range map[string]struct {
		mine, served *props // mine: ours() when nil
		wantMissing  []string
	}{
		"the same schema": {served: ptr.To(ours())},
		"a leaf": {served: ptr.To(without(ours(), "spec.driver.kernelModuleType")),
			wantMissing: []string{"spec.driver.kernelModuleType"}},
		"a subtree is named once, at its top": {served: ptr.To(without(ours(), "spec.driver.licensing")),
			wantMissing: []string{"spec.driver.licensing"}},
		"several, sorted": {served: ptr.To(without(without(without(ours(), "status.components"), "spec.pools"), "spec.driver.version")),
			wantMissing: []string{"spec.driver.version", "spec.pools", "status.components"}},
		"a field of a list's items": {served: ptr.To(without(ours(), "spec.driver.env.[].value")),
			wantMissing: []string{"spec.driver.env[].value"}},
		"a field of a map's values": {served: ptr.To(without(ours(), "spec.pools.*.zone")),
			wantMissing: []string{"spec.pools.*.zone"}},
		"a map the served schema makes a struct without fields": {
			served:      ptr.To(replace(ours(), "spec.nodeSelector", props{Type: "object"})),
			wantMissing: []string{"spec.nodeSelector.*"}},
		"a subtree that preserves unknown fields lacks nothing": {
			served: ptr.To(replace(ours(), "spec.driver", preserving(props{Type: "object"})))},
		"below a preserving subtree, its declared fields are compared": {
			served: ptr.To(replace(ours(), "spec.driver", preserving(object(map[string]props{
				"licensing": object(map[string]props{"configMapName": leaf()})})))),
			wantMissing: []string{"spec.driver.licensing.nlsEnabled"}},
		"a list whose items preserve unknown fields": {
			served: ptr.To(replace(ours(), "spec.driver.env", arrayOf(preserving(props{Type: "object"}))))},
		"a preserving list without items": {
			served: ptr.To(replace(ours(), "spec.driver.env", preserving(props{Type: "array"})))},
		"a map of anything (additionalProperties: true)": {
			served: ptr.To(replace(ours(), "spec.pools", props{Type: "object",
				AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true}}))},
		"a struct the served schema makes a map of strings": {
			served:      ptr.To(replace(ours(), "spec.driver.licensing", mapOf(leaf()))),
			wantMissing: nil},
		"an embedded resource keeps apiVersion, kind and metadata": {
			mine: ptr.To(object(map[string]props{"template": object(map[string]props{
				"apiVersion": leaf(), "kind": leaf(), "metadata": object(map[string]props{"name": leaf()}), "spec": leaf(), "data": leaf()})})),
			served: ptr.To(object(map[string]props{"template": {Type: "object", XEmbeddedResource: true,
				Properties: map[string]props{"spec": leaf()}}})),
			wantMissing: []string{"template.data"}},
		"a newer served schema": {
			served: ptr.To(replace(ours(), "spec.driver.newField", leaf()))},
		"no served schema": {wantMissing: []string{"spec", "status"}},
	} {
		t.Run(name, func(t *testing.T) {
			o := ours()
			if tc.mine != nil {
				o = *tc.mine
			}
			got := gpustack.MissingFields(&o, tc.served)
			if diff := cmp.Diff(tc.wantMissing, got); diff != "" {
				t.Errorf("missing fields (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCRDMissingFieldsComparesTheVersion(t *testing.T) {
	crd := func(versions ...apiextensionsv1.CustomResourceDefinitionVersion) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{Versions: versions}}
	}
	version := func(name string, s props) apiextensionsv1.CustomResourceDefinitionVersion {
		return apiextensionsv1.CustomResourceDefinitionVersion{Name: name, Served: true,
			Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &s}}
	}
	mine := crd(version("v1", ours()))
	for name, tc := range map[string]struct {
		served      *apiextensionsv1.CustomResourceDefinition
		wantMissing []string
	}{
		"same":                 {served: crd(version("v1", ours()))},
		"older v1":             {served: crd(version("v1alpha1", ours()), version("v1", without(ours(), "spec.pools"))), wantMissing: []string{"spec.pools"}},
		"another version only": {served: crd(version("v1beta1", ours())), wantMissing: []string{"spec", "status"}},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.wantMissing, gpustack.CRDMissingFields(mine, tc.served, "v1")); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// gpufleet's own CRDs, compared with themselves, lack nothing; with a few
// properties deleted, exactly those.
func TestOwnCRDs(t *testing.T) {
	own, err := gpustack.OwnCRDs()
	if err != nil {
		t.Fatal(err)
	}
	for name, version := range map[string]string{gpustack.ClusterPolicyCRD: "v1", gpustack.NVIDIADriverCRD: "v1alpha1"} {
		crd := own[name]
		if crd == nil || crd.Name != name {
			t.Fatalf("OwnCRDs has no %s", name)
		}
		if m := gpustack.CRDMissingFields(crd, crd.DeepCopy(), version); len(m) != 0 {
			t.Errorf("%s compared with itself lacks %v", name, m)
		}
	}
	older := own[gpustack.ClusterPolicyCRD].DeepCopy()
	spec := older.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	driver := spec.Properties["driver"]
	delete(driver.Properties, "kernelModuleType")
	spec.Properties["driver"] = driver
	older.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"] = spec
	want := []string{"spec.driver.kernelModuleType"}
	if diff := cmp.Diff(want, gpustack.CRDMissingFields(own[gpustack.ClusterPolicyCRD], older, "v1")); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestSchemaCondition(t *testing.T) {
	many := []string{"spec.a", "spec.b", "spec.c", "spec.d", "spec.e", "spec.f", "status.components"}
	for name, tc := range map[string]struct {
		reports      []gpustack.SchemaReport
		wantStatus   metav1.ConditionStatus
		wantReason   string
		wantContains []string
	}{
		"nothing compared": {wantStatus: metav1.ConditionTrue, wantReason: "AllFieldsServed"},
		"nothing missing": {reports: []gpustack.SchemaReport{{CRD: gpustack.ClusterPolicyCRD, Version: "v1"}, {CRD: gpustack.NVIDIADriverCRD, Version: "v1alpha1"}},
			wantStatus: metav1.ConditionTrue, wantReason: "AllFieldsServed"},
		"one field": {reports: []gpustack.SchemaReport{{CRD: gpustack.ClusterPolicyCRD, Version: "v1", Missing: []string{"spec.driver.kernelModuleType"}}},
			wantStatus: metav1.ConditionFalse, wantReason: gpustack.ReasonOlderSchemaInstalled,
			wantContains: []string{"CustomResourceDefinition clusterpolicies.nvidia.com (v1) lacks 1 field of gpufleet's schema: spec.driver.kernelModuleType.",
				"helm upgrade gpufleet-crds", "kubectl apply --server-side --force-conflicts -f charts/gpufleet/crds/", "operator.upgradeCRD=false"}},
		"the first five of many, in both CRDs": {reports: []gpustack.SchemaReport{{CRD: gpustack.ClusterPolicyCRD, Version: "v1", Missing: many},
			{CRD: gpustack.NVIDIADriverCRD, Version: "v1alpha1", Missing: []string{"spec.kernelModuleType", "spec.x"}}},
			wantStatus: metav1.ConditionFalse, wantReason: gpustack.ReasonOlderSchemaInstalled,
			wantContains: []string{"clusterpolicies.nvidia.com (v1) lacks 7 fields of gpufleet's schema: spec.a, spec.b, spec.c, spec.d, spec.e and 2 more; ",
				"nvidiadrivers.nvidia.com (v1alpha1) lacks 2 fields of gpufleet's schema: spec.kernelModuleType, spec.x."}},
	} {
		t.Run(name, func(t *testing.T) {
			s, reason, msg := gpustack.SchemaCondition(tc.reports)
			if s != tc.wantStatus || reason != tc.wantReason {
				t.Errorf("got %s %s, want %s %s (%s)", s, reason, tc.wantStatus, tc.wantReason, msg)
			}
			for _, w := range tc.wantContains {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
		})
	}
}

func TestDropFields(t *testing.T) {
	obj := func() map[string]any {
		return map[string]any{
			"spec": map[string]any{
				"driver": map[string]any{"version": "1", "env": []any{map[string]any{"name": "A", "value": "1"}, map[string]any{"name": "B"}}},
				"pools":  map[string]any{"a": map[string]any{"size": "1", "zone": "z"}, "b": map[string]any{"zone": "y"}},
				"matrix": []any{[]any{map[string]any{"x": "1", "y": "2"}}},
			},
			"status": map[string]any{"state": "ready", "components": []any{map[string]any{"name": "driver"}}},
		}
	}
	for name, tc := range map[string]struct {
		paths []string
		want  func(map[string]any)
	}{
		"none":              {want: func(map[string]any) {}},
		"a top-level field": {paths: []string{"status"}, want: func(m map[string]any) { delete(m, "status") }},
		"a nested field":    {paths: []string{"status.components"}, want: func(m map[string]any) { delete(m["status"].(map[string]any), "components") }},
		"a field of list items": {paths: []string{"spec.driver.env[].value"}, want: func(m map[string]any) {
			delete(m["spec"].(map[string]any)["driver"].(map[string]any)["env"].([]any)[0].(map[string]any), "value")
		}},
		"a field of map values": {paths: []string{"spec.pools.*.zone"}, want: func(m map[string]any) {
			pools := m["spec"].(map[string]any)["pools"].(map[string]any)
			delete(pools["a"].(map[string]any), "zone")
			delete(pools["b"].(map[string]any), "zone")
		}},
		"every map value": {paths: []string{"spec.pools.*"}, want: func(m map[string]any) { m["spec"].(map[string]any)["pools"] = map[string]any{} }},
		"lists of lists": {paths: []string{"spec.matrix[][].y"}, want: func(m map[string]any) {
			delete(m["spec"].(map[string]any)["matrix"].([]any)[0].([]any)[0].(map[string]any), "y")
		}},
		"absent paths and mismatched types": {paths: []string{"spec.nothing.here", "spec.driver.version.x", "spec.driver.env.name", "status.state[].x", "spec.pools.a[]"},
			want: func(map[string]any) {}},
	} {
		t.Run(name, func(t *testing.T) {
			got, want := obj(), obj()
			gpustack.DropFields(got, tc.paths)
			tc.want(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// schemaFrom builds a schema tree from fuzz bytes: property names from a
// small alphabet (so that two trees share some), nested objects, lists,
// maps, preserve-unknown-fields and embedded-resource flags.
func schemaFrom(data []byte, depth int) (props, []byte) {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	p := props{Type: "object"}
	flags := next()
	if flags&1 != 0 {
		p.XPreserveUnknownFields = ptr.To(true)
	}
	if flags&2 != 0 {
		p.XEmbeddedResource = true
	}
	n := int(next() % 4)
	if depth > 4 {
		n = 0
	}
	for range n {
		kind := next()
		name := string(rune('a' + kind%5))
		var child props
		child, data = schemaFrom(data, depth+1)
		switch kind % 4 {
		case 1:
			child = arrayOf(child)
		case 2:
			child = mapOf(child)
		case 3:
			child = props{Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Allows: kind&8 != 0}}
		}
		if p.Properties == nil {
			p.Properties = map[string]props{}
		}
		p.Properties[name] = child
	}
	return p, data
}

func FuzzMissingFields(f *testing.F) {
	f.Add([]byte{0, 3, 0, 0, 2, 1, 0, 0, 2}, []byte{1, 1, 0})
	f.Add([]byte{2, 2, 1, 0, 1, 0, 2, 0, 0}, []byte{0, 2, 2, 0, 0, 1, 0, 0})
	f.Add([]byte{0, 3, 3, 0, 0, 6, 0, 0, 9, 1, 3, 1, 1, 1}, []byte{})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		mine, _ := schemaFrom(a, 0)
		served, _ := schemaFrom(b, 0)
		got := gpustack.MissingFields(&mine, &served)
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Errorf("not sorted or repeated: %v", got)
		}
		if same := gpustack.MissingFields(&mine, mine.DeepCopy()); len(same) != 0 {
			t.Errorf("a schema compared with itself lacks %v", same)
		}
		// A root that preserves unknown fields lacks none of the top-level
		// fields it does not declare.
		served.XPreserveUnknownFields = ptr.To(true)
		for _, p := range gpustack.MissingFields(&mine, &served) {
			if !strings.ContainsAny(p, ".[") {
				t.Errorf("a preserving root lacks %q", p)
			}
		}
		// Whatever is missing can be dropped from an object without panic.
		gpustack.DropFields(map[string]any{"a": map[string]any{"b": []any{"x", map[string]any{"c": 1}}}, "d": "e"}, got)
	})
}
