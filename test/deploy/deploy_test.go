// Package deploy checks the shipped manifests (config/default, built with
// kustomize, and the Helm chart charts/gpufleet): they render, the chart
// ships the generated CRDs and RBAC and the same operator as kustomize, the
// real API server accepts every object, and the operator running as the
// ServiceAccount they define, with exactly the RBAC they grant, elects a
// leader and takes a NodeMaintenance through to Ready.
package deploy

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
)

const ns = "gpufleet-system"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// render builds config/default.
func render(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	root, err := devcluster.SourceRoot()
	if err != nil {
		t.Fatal(err)
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, "config", "default"))
	if err != nil {
		t.Fatalf("kustomize build config/default: %v", err)
	}
	var out []*unstructured.Unstructured
	for _, r := range res.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, normalized(t, m))
	}
	return out
}

// normalized is m as the API machinery decodes JSON (int64 numbers), so
// that objects from kustomize and from helm compare equal.
func normalized(t *testing.T, m map[string]any) *unstructured.Unstructured {
	t.Helper()
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	return u
}

func TestManifestsRender(t *testing.T) {
	objs := render(t)
	kinds := map[string][]string{}
	for _, o := range objs {
		kinds[o.GetKind()] = append(kinds[o.GetKind()], o.GetName())
		if o.GetKind() != "Namespace" && o.GetNamespace() != "" && o.GetNamespace() != ns {
			t.Errorf("%s %s in namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
		}
	}
	// Every generated CRD is shipped.
	root, _ := devcluster.SourceRoot()
	files, _ := fs.Glob(os.DirFS(filepath.Join(root, "config")), "crd/bases/*.yaml")
	if len(kinds["CustomResourceDefinition"]) != len(files) || len(files) == 0 {
		t.Errorf("config/crd/kustomization.yaml lists %d CRDs, config/crd/bases has %d", len(kinds["CustomResourceDefinition"]), len(files))
	}
	for kind, want := range map[string][]string{
		"Deployment":         {"gpufleet-operator"},
		"DaemonSet":          {"gpufleet-agent"},
		"ServiceAccount":     {"gpufleet-agent", "gpufleet-operator"},
		"ClusterRole":        {"gpufleet-agent", "gpufleet-metrics-reader", "gpufleet-operator"},
		"ClusterRoleBinding": {"gpufleet-agent", "gpufleet-operator"},
		"Role":               {"gpufleet-operator"},
		"RoleBinding":        {"gpufleet-operator"},
		"Namespace":          {ns},
	} {
		got := slices.Sorted(slices.Values(kinds[kind]))
		if !slices.Equal(got, want) {
			t.Errorf("%s: got %v, want %v", kind, got, want)
		}
	}
}

// TestOperatorRunsAsItsServiceAccount installs gpufleet on the local
// cluster, once from config/default (strict create of every object) and
// once with `helm install` of charts/gpufleet (server-side apply), and runs
// the operator with a token of the ServiceAccount each defines, with leader
// election as the Deployment runs it, through a NodeMaintenance.
func TestOperatorRunsAsItsServiceAccount(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local cluster (run without -short)")
	}
	t.Run("kustomize", func(t *testing.T) {
		cluster := startCluster(t)
		apply(t, cluster.Config, render(t))
		_, _ = runOperatorAs(t, cluster, "gpufleet-operator")
	})
	t.Run("helm", func(t *testing.T) {
		cluster := startCluster(t)
		// A release name other than "gpufleet": every object is named
		// after it, and the operator runs with that chart's RBAC only.
		helmRun(t, "install", "fleet", chartDir(t), "--namespace", ns, "--create-namespace",
			"--kubeconfig", cluster.Kubeconfig, "--set", "maintenanceOperatorConfig.create=true",
			"--set", "maintenanceOperatorConfig.spec.maxParallelOperations=2")
		kube, _ := runOperatorAs(t, cluster, "fleet-gpufleet-operator")
		// An upgrade with new values applies over the running release.
		helmRun(t, "upgrade", "fleet", chartDir(t), "--namespace", ns, "--kubeconfig", cluster.Kubeconfig,
			"--reuse-values", "--set", "maintenanceOperatorConfig.spec.maxParallelOperations=5", "--set", "operator.replicas=1")
		cfg := &maintenancev1.MaintenanceOperatorConfig{}
		if err := kube.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "default"}, cfg); err != nil {
			t.Fatal(err)
		}
		if got := cfg.Spec.MaxParallelOperations.String(); got != "5" {
			t.Errorf("after helm upgrade maxParallelOperations is %s, want 5", got)
		}
	})
}

func startCluster(t *testing.T) *devcluster.Cluster {
	t.Helper()
	ctx := t.Context()
	cluster, err := devcluster.Start(ctx, devcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	if err := cluster.AddNodes(ctx, devcluster.GPUNodes(2, 1)...); err != nil {
		t.Fatal(err)
	}
	return cluster
}

// runOperatorAs runs the operator with a token of the ServiceAccount sa in
// ns (it gets exactly what the installed manifests grant it), waits for its
// lease, and takes a NodeMaintenance with a drain to Ready and back. It
// returns an admin client of the cluster and a function that stops the
// operator (as its pod's termination would: the lease is released).
func runOperatorAs(t *testing.T, cluster *devcluster.Cluster, sa string) (client.Client, func()) {
	t.Helper()
	ctx := t.Context()
	stop, saCfg := startOperatorAs(t, cluster, sa)
	kube := adminClient(t, cluster)
	nm := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "deploy-check"},
		Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "deploy.gpufleet.dev", NodeName: "gpu-000", DrainSpec: &maintenancev1.DrainSpec{}},
	}
	if err := kube.Create(ctx, nm); err != nil {
		t.Fatal(err)
	}
	waitReady(t, kube, nm)
	if err := kube.Delete(ctx, nm); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, "gpu-000", metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable, nil
	})
	if err != nil {
		t.Fatalf("node not uncordoned after the NodeMaintenance was deleted: %v", err)
	}
	checkLeastPrivilege(t, cluster, saCfg, sa)
	return kube, stop
}

func adminClient(t *testing.T, cluster *devcluster.Cluster) client.Client {
	t.Helper()
	scheme, _ := operator.Scheme()
	kube, err := client.New(cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

// waitReady waits until nm is Ready=True.
func waitReady(t *testing.T, kube client.Client, nm *maintenancev1.NodeMaintenance) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(nm), nm); err != nil {
			return false, err
		}
		return nm.IsReady(), nil
	})
	if err != nil {
		t.Fatalf("NodeMaintenance %s never Ready: %v; status %+v", nm.Name, err, nm.Status)
	}
}

// saConfig is a client configuration with a token of the ServiceAccount sa
// of ns.
func saConfig(t *testing.T, cluster *devcluster.Cluster, sa string) *rest.Config {
	t.Helper()
	tok, err := cluster.Client.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cluster.Config)
	cfg.BearerToken = tok.Status.Token
	return cfg
}

// startOperatorAs starts the operator as the ServiceAccount sa (lease
// named sa) and waits until it is elected. The returned stop is safe to
// call more than once; the test's cleanup calls it too.
func startOperatorAs(t *testing.T, cluster *devcluster.Cluster, sa string) (func(), *rest.Config) {
	t.Helper()
	saCfg := saConfig(t, cluster, sa)
	mgr, err := operator.New(saCfg, operator.Options{Namespace: ns, MetricsAddr: "0", ProbeAddr: "0", LeaderElection: true,
		LeaderElectionID: sa, LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	opCtx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(opCtx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("operator: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-mgr.Elected():
	case err := <-done:
		t.Fatalf("operator stopped before it was elected: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("operator never acquired its lease")
	}
	return stop, saCfg
}

// apply creates every object with strict field validation (an unknown or
// misspelt field fails), CRDs first.
func apply(t *testing.T, cfg *rest.Config, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := t.Context()
	dyn := dynamic.NewForConfigOrDie(cfg)
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int { return order(a) - order(b) })
	// Discovery is re-read when a kind is not known yet (a CRD just created).
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		var m *meta.RESTMapping
		var lastErr error // the mapping's last error, kept for the failure message
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			m, lastErr = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if lastErr != nil {
				mapper.Reset()
				return false, nil //nolint:nilerr // not served yet (a CRD just created): read discovery again; the last error is reported on timeout
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("no API for %s: %v (last: %v)", gvk, err, lastErr)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if o.GetKind() == "CustomResourceDefinition" {
			waitEstablished(t, cfg, o.GetName())
		}
	}
}

// order puts namespaces and CRDs before the objects that need them.
func order(o *unstructured.Unstructured) int {
	switch o.GetKind() {
	case "Namespace":
		return 0
	case "CustomResourceDefinition":
		return 1
	}
	return 2
}

func waitEstablished(t *testing.T, cfg *rest.Config, name string) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(cfg)
	crds := dyn.Resource(crdGVR)
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // retried
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD %s never established: %v", name, err)
	}
}
