package gpustack

import (
	"fmt"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The served schema of the CRDs gpufleet reads (schemacache.go reads it):
// NVIDIA's GPU Operator chart puts its own, older, ClusterPolicy and
// NVIDIADriver CRDs back on every `helm upgrade` (its pre-upgrade hook).
// The API server then drops the fields that schema lacks from every write
// and read; gpufleet goes on with the fields it gets, and says which it
// does not get.

// ConditionSchemaCurrent is False while the API server serves an older
// schema of a CRD gpufleet reads (OlderSchemaInstalled), True otherwise.
const ConditionSchemaCurrent = "SchemaCurrent"

// ReasonOlderSchemaInstalled: a CRD gpufleet reads lacks fields of
// gpufleet's schema (Warning; the reason of SchemaCurrent=False).
const ReasonOlderSchemaInstalled = "OlderSchemaInstalled"

const reasonSchemaCurrent = "AllFieldsServed"

// MissingFields returns the field paths of ours (gpufleet's schema of a
// version) that served (the API server's schema of that version) lacks,
// sorted: "spec.driver.kernelModuleType", "spec.driver.env[].name" (an
// array's items), "spec.nodeSelector.*" (a map's values). Only the top of
// a missing subtree is named. A subtree whose served schema preserves
// unknown fields (x-kubernetes-preserve-unknown-fields, additionalProperties
// true) lacks nothing, except below the fields it declares. A nil served
// lacks every field of ours; types and validations are not compared.
func MissingFields(ours, served *apiextensionsv1.JSONSchemaProps) []string {
	var out []string
	missing(ours, served, "", &out)
	slices.Sort(out)
	return slices.Compact(out)
}

func missing(ours, served *apiextensionsv1.JSONSchemaProps, path string, out *[]string) {
	if ours == nil {
		return
	}
	for name := range ours.Properties {
		p := ours.Properties[name]
		child, known := property(served, name)
		switch {
		case !known:
			*out = append(*out, join(path, name))
		case child != nil:
			missing(&p, child, join(path, name), out)
		}
	}
	if ours.AdditionalProperties != nil && ours.AdditionalProperties.Schema != nil {
		if child, known := values(served); !known {
			*out = append(*out, join(path, "*"))
		} else if child != nil {
			missing(ours.AdditionalProperties.Schema, child, join(path, "*"), out)
		}
	}
	if ours.Items != nil && ours.Items.Schema != nil {
		var child *apiextensionsv1.JSONSchemaProps
		switch {
		case served != nil && served.Items != nil && served.Items.Schema != nil:
			child = served.Items.Schema
		case served != nil && preserves(served):
			return
		}
		missing(ours.Items.Schema, child, path+"[]", out)
	}
}

// property is served's schema of the field name: known is false when the
// API server drops it; a nil schema of a known field keeps all below it.
func property(served *apiextensionsv1.JSONSchemaProps, name string) (schema *apiextensionsv1.JSONSchemaProps, known bool) {
	if served == nil {
		return nil, false
	}
	if p, ok := served.Properties[name]; ok {
		return &p, true
	}
	if served.XEmbeddedResource && (name == "apiVersion" || name == "kind" || name == "metadata") {
		return nil, true
	}
	return values(served)
}

// values is served's schema of a map's values (additionalProperties).
func values(served *apiextensionsv1.JSONSchemaProps) (schema *apiextensionsv1.JSONSchemaProps, known bool) {
	switch {
	case served == nil:
		return nil, false
	case served.AdditionalProperties != nil && served.AdditionalProperties.Schema != nil:
		return served.AdditionalProperties.Schema, true
	case preserves(served):
		return nil, true
	}
	return nil, false
}

func preserves(s *apiextensionsv1.JSONSchemaProps) bool {
	return (s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields) ||
		(s.AdditionalProperties != nil && s.AdditionalProperties.Allows && s.AdditionalProperties.Schema == nil)
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// CRDMissingFields is MissingFields of one version of gpufleet's CRD ours
// and of the CRD the API server serves (served lacking that version lacks
// every field of it).
func CRDMissingFields(ours, served *apiextensionsv1.CustomResourceDefinition, version string) []string {
	schemaOf := func(crd *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.JSONSchemaProps {
		if crd == nil {
			return nil
		}
		for _, v := range crd.Spec.Versions {
			if v.Name == version && v.Schema != nil {
				return v.Schema.OpenAPIV3Schema
			}
		}
		return nil
	}
	return MissingFields(schemaOf(ours), schemaOf(served))
}

// SchemaReport is what one served CRD lacks.
type SchemaReport struct {
	CRD     string // clusterpolicies.nvidia.com
	Version string
	Missing []string
}

// SchemaCondition is the SchemaCurrent condition for reports (their order
// kept): False naming each CRD that lacks fields, the number and the
// first few, and the way back to gpufleet's schema; True when none does.
func SchemaCondition(reports []SchemaReport) (metav1.ConditionStatus, string, string) {
	var parts []string
	for _, r := range reports {
		if len(r.Missing) == 0 {
			continue
		}
		noun := "fields"
		if len(r.Missing) == 1 {
			noun = "field"
		}
		parts = append(parts, fmt.Sprintf("CustomResourceDefinition %s (%s) lacks %d %s of gpufleet's schema: %s",
			r.CRD, r.Version, len(r.Missing), noun, summarize(r.Missing, 5)))
	}
	if len(parts) == 0 {
		return metav1.ConditionTrue, reasonSchemaCurrent, "the API server serves gpufleet's schema"
	}
	return metav1.ConditionFalse, ReasonOlderSchemaInstalled, strings.Join(parts, "; ") +
		". The API server drops them; gpufleet works with the fields it gets. Install gpufleet's CRDs again " +
		"(helm upgrade gpufleet-crds, or kubectl apply --server-side --force-conflicts -f charts/gpufleet/crds/) " +
		"and keep the GPU Operator chart from putting its own back (operator.upgradeCRD=false)"
}

// DropFields removes the fields at paths (as MissingFields names them)
// from obj, a decoded JSON object: what the API server would drop from
// it. Paths that obj does not have are skipped.
func DropFields(obj map[string]any, paths []string) {
	for _, p := range paths {
		dropField(obj, splitPath(p))
	}
}

// splitPath splits "a.b[].c.*" into a, b, [], c, *.
func splitPath(path string) []string {
	var out []string
	for _, part := range strings.Split(path, ".") {
		name := strings.TrimRight(part, "[]")
		out = append(out, name)
		for range strings.Count(part[len(name):], "[]") {
			out = append(out, "[]")
		}
	}
	return out
}

func dropField(v any, path []string) {
	if len(path) == 0 {
		return
	}
	switch path[0] {
	case "[]":
		list, _ := v.([]any)
		for _, item := range list {
			dropField(item, path[1:])
		}
	case "*":
		m, _ := v.(map[string]any)
		for k := range m {
			if len(path) == 1 {
				delete(m, k)
			} else {
				dropField(m[k], path[1:])
			}
		}
	default:
		m, _ := v.(map[string]any)
		if len(path) == 1 {
			delete(m, path[0])
		} else if child, ok := m[path[0]]; ok {
			dropField(child, path[1:])
		}
	}
}
