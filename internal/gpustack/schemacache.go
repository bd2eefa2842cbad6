package gpustack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/yaml"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/config"
)

// The CRDs whose served schema gpufleet compares with its own.
const (
	ClusterPolicyCRD = "clusterpolicies.nvidia.com"
	NVIDIADriverCRD  = "nvidiadrivers.nvidia.com"
)

// ServedSchemas tells which fields of gpufleet's ClusterPolicy and
// NVIDIADriver schemas the API server's CRDs lack (schema.go).
type ServedSchemas struct {
	// Ours are gpufleet's CRDs by name (OwnCRDs).
	Ours map[string]*apiextensionsv1.CustomResourceDefinition
	// Served reads the API server's CRDs.
	Served client.Reader

	mu sync.Mutex
	// memo: what each served CRD lacks, by its UID and generation (its
	// schema is compared again only when it changed).
	memo map[string]schemaMemo
}

type schemaMemo struct {
	uid        types.UID
	generation int64
	missing    []string
}

// OwnCRDs reads gpufleet's ClusterPolicy and NVIDIADriver CRDs from the
// ones embedded in the binary (config/crd/bases).
func OwnCRDs() (map[string]*apiextensionsv1.CustomResourceDefinition, error) {
	out := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, name := range []string{ClusterPolicyCRD, NVIDIADriverCRD} {
		group, _, _ := strings.Cut(name, ".")
		file := "crd/bases/nvidia.com_" + group + ".yaml"
		data, err := config.CRDs.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading gpufleet's CRD %s: %w", name, err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", file, err)
		}
		out[name] = crd
	}
	return out, nil
}

// Reports is what the served CRDs the policy uses lack: the ClusterPolicy
// CRD (v1), and the NVIDIADriver CRD (v1alpha1) when the policy hands the
// driver to NVIDIADrivers. A CRD that is not there is not reported.
func (s *ServedSchemas) Reports(ctx context.Context, policy *nvidiav1.ClusterPolicy) ([]SchemaReport, error) {
	if s == nil {
		return nil, nil
	}
	check := []SchemaReport{{CRD: ClusterPolicyCRD, Version: nvidiav1.GroupVersion.Version}}
	if isTrue(policy.Spec.Driver.UseNvidiaDriverCRD) {
		check = append(check, SchemaReport{CRD: NVIDIADriverCRD, Version: nvidiav1alpha1.GroupVersion.Version})
	}
	var out []SchemaReport
	for _, r := range check {
		served := &apiextensionsv1.CustomResourceDefinition{}
		if err := s.Served.Get(ctx, client.ObjectKey{Name: r.CRD}, served); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("reading CustomResourceDefinition %s: %w", r.CRD, err)
		}
		r.Missing = s.missing(r.CRD, r.Version, served)
		out = append(out, r)
	}
	return out, nil
}

func (s *ServedSchemas) missing(name, version string, served *apiextensionsv1.CustomResourceDefinition) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.memo[name]; ok && m.uid == served.UID && m.generation == served.Generation && served.UID != "" {
		return m.missing
	}
	missing := CRDMissingFields(s.Ours[name], served, version)
	if s.memo == nil {
		s.memo = map[string]schemaMemo{}
	}
	s.memo[name] = schemaMemo{uid: served.UID, generation: served.Generation, missing: missing}
	return missing
}

// servedStatus is status as the API server keeps it: without the fields
// the served ClusterPolicy schema lacks (else every pass would find the
// status changed and write it again).
func servedStatus(status *nvidiav1.ClusterPolicyStatus, reports []SchemaReport) (*nvidiav1.ClusterPolicyStatus, error) {
	var drop []string
	for _, r := range reports {
		if r.CRD != ClusterPolicyCRD {
			continue
		}
		for _, p := range r.Missing {
			if p == "status" || strings.HasPrefix(p, "status.") {
				drop = append(drop, p)
			}
		}
	}
	if len(drop) == 0 {
		return status, nil
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return nil, fmt.Errorf("converting the ClusterPolicy status: %w", err)
	}
	obj := map[string]any{"status": m}
	DropFields(obj, drop)
	out := &nvidiav1.ClusterPolicyStatus{}
	if m, ok := obj["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, out); err != nil {
			return nil, fmt.Errorf("converting the ClusterPolicy status: %w", err)
		}
	}
	return out, nil
}

// newSchemaCaches are caches of the ClusterPolicy and NVIDIADriver CRDs
// (one each, selected by name: the operator may read no other CRD, and a
// field selector names one object), started with the manager's caches.
func newSchemaCaches(mgr manager.Manager) (map[string]cache.Cache, error) {
	out := map[string]cache.Cache{}
	for _, name := range []string{ClusterPolicyCRD, NVIDIADriverCRD} {
		c, err := cluster.New(mgr.GetConfig(), func(o *cluster.Options) {
			o.Scheme = mgr.GetScheme()
			o.HTTPClient = mgr.GetHTTPClient()
			o.MapperProvider = func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mgr.GetRESTMapper(), nil }
			o.Cache = cache.Options{ByObject: map[client.Object]cache.ByObject{
				&apiextensionsv1.CustomResourceDefinition{}: {Field: fields.OneTermEqualSelector("metadata.name", name), Transform: stripSchemaCRD},
			}}
		})
		if err != nil {
			return nil, fmt.Errorf("creating the cache of CRD %s: %w", name, err)
		}
		if err := mgr.Add(c); err != nil {
			return nil, fmt.Errorf("adding the cache of CRD %s: %w", name, err)
		}
		out[name] = c.GetCache()
	}
	return out, nil
}

// byName reads each CRD from its own cache.
type byName map[string]cache.Cache

func (b byName) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c, ok := b[key.Name]
	if !ok {
		return fmt.Errorf("CRD %s is not cached", key.Name)
	}
	return c.Get(ctx, key, obj, opts...)
}

func (b byName) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("the CRD caches are read by name")
}

// stripSchemaCRD keeps of a CRD what its schema comparison reads: its
// versions' names, served flags and schemas (not its status, nor its
// annotations: a client-side apply's copy doubles its size).
var stripSchemaCRD toolscache.TransformFunc = func(obj any) (any, error) {
	crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
	if !ok {
		return obj, nil
	}
	crd.ObjectMeta = metav1.ObjectMeta{Name: crd.Name, UID: crd.UID, ResourceVersion: crd.ResourceVersion, Generation: crd.Generation,
		CreationTimestamp: crd.CreationTimestamp, DeletionTimestamp: crd.DeletionTimestamp}
	versions := make([]apiextensionsv1.CustomResourceDefinitionVersion, len(crd.Spec.Versions))
	for i, v := range crd.Spec.Versions {
		versions[i] = apiextensionsv1.CustomResourceDefinitionVersion{Name: v.Name, Served: v.Served, Storage: v.Storage, Schema: v.Schema}
	}
	crd.Spec = apiextensionsv1.CustomResourceDefinitionSpec{Group: crd.Spec.Group, Names: crd.Spec.Names, Scope: crd.Spec.Scope, Versions: versions}
	crd.Status = apiextensionsv1.CustomResourceDefinitionStatus{}
	return crd, nil
}
