// Package agentbinding checks, on the local cluster with real
// service-account tokens, the admission policies gpufleet ships: an agent
// writes its own node's objects only, and on its node's status its own
// condition only; no DeviceTaintRule may name no pool; the operator may
// change one label of a pod and nothing else.
package agentbinding

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	gpufleetconfig "github.com/gpufleet/gpufleet/config"
	agentconfig "github.com/gpufleet/gpufleet/config/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/operator"
)

const ns = "gpufleet-system"

var (
	env   *devcluster.Env
	nodes = []string{"gpu-000", "gpu-001"}
)

func TestMain(m *testing.M) {
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var specs []devcluster.NodeSpec
	for _, n := range nodes {
		specs = append(specs, devcluster.NodeSpec{Name: n, Pool: "a", GPUs: 8})
	}
	os.Exit(devtest.Main(m, specs, ns, scheme, func(e *devcluster.Env) { env = e }))
}

// apply creates every object of a multi-document manifest.
func apply(t *testing.T, manifest []byte) {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetNamespace() == "" && u.GetKind() == "ServiceAccount" {
			u.SetNamespace(ns)
		}
		if err := env.Kube.Create(t.Context(), u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// agentToken is a token of the agent's ServiceAccount bound to a pod of
// the agent on node (as the kubelet projects it into the agent's pod);
// node "" gives a token bound to nothing.
func agentToken(t *testing.T, node string) string {
	t.Helper()
	ctx := t.Context()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
	if node != "" {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpufleet-agent-" + node},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "gpufleet-agent",
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers:  []corev1.Container{{Name: "agent", Image: "gpufleet"}}}}
		if err := env.Kube.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if err := env.Kube.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "gpufleet-agent", req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// as is a client that authenticates with token only.
func as(t *testing.T, token string) client.Client {
	t.Helper()
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = token
	c, err := client.New(cfg, client.Options{Scheme: env.Kube.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func conditionPatch(i int) client.Patch {
	return client.RawPatch(types.StrategicMergePatchType, fmt.Appendf(nil,
		`{"status":{"conditions":[{"type":"GPUProblem","status":"False","reason":"NoGPUFault","message":"test %d","lastHeartbeatTime":null,"lastTransitionTime":"2026-12-06T00:00:00Z"}]}}`, i))
}

func gpuFault(node string) *repairv1.GPUFault {
	return &repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: node + "-0000-18-00-0"},
		Spec: repairv1.GPUFaultSpec{NodeName: node, GPU: repairv1.GPURef{PCIBusID: "0000:18:00.0", Index: ptr.To[int32](0)}}}
}

func nodeRepair(node string) *repairv1.NodeRepair {
	return &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: "repair-" + node},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Policy: "default", Actions: []repairv1.Action{repairv1.ActionRestartKubelet},
			Fault: repairv1.Fault{Rule: "kubelet", ConditionType: "Ready", Status: "False", Since: metav1.NewTime(time.Now().Truncate(time.Second))}}}
}

func wantForbidden(t *testing.T, what string, err error, substr string) {
	t.Helper()
	if err == nil || !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), substr) {
		t.Errorf("%s: got %v, want refused with %q", what, err, substr)
	}
}

// TestAgentWritesOnlyItsOwnNode: with the policy in place, the agent of
// gpu-000 (a real token bound to its pod there) writes gpu-000's status
// condition, a GPUFault of gpu-000 and the status of gpu-000's NodeRepair;
// the same writes for gpu-001 are refused, and so is every write with a
// token of the agent bound to no node.
func TestAgentWritesOnlyItsOwnNode(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	apply(t, agentconfig.RBAC)
	apply(t, agentconfig.AgentOwnNode)
	for _, n := range nodes {
		if err := env.Kube.Create(ctx, nodeRepair(n)); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	a, unbound := as(t, agentToken(t, nodes[0])), as(t, agentToken(t, ""))

	// The policy is in force once the API server has loaded it.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := a.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[1]}}, conditionPatch(0))
		return apierrors.IsForbidden(err) || apierrors.IsInvalid(err), nil
	})
	if err != nil {
		t.Fatal("the agent of gpu-000 could still write gpu-001's status after 30 s: the policy is not in force")
	}

	// Its own node: allowed.
	if err := a.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[0]}}, conditionPatch(1)); err != nil {
		t.Errorf("own node's status condition: %v", err)
	}
	if err := a.Create(ctx, gpuFault(nodes[0])); err != nil {
		t.Errorf("a GPUFault of its own node: %v", err)
	}
	own := &repairv1.NodeRepair{}
	if err := a.Get(ctx, client.ObjectKey{Name: "repair-" + nodes[0]}, own); err != nil {
		t.Fatal(err)
	}
	before := own.DeepCopy()
	own.Status.Message = "agent of gpu-000"
	if err := a.Status().Patch(ctx, own, client.MergeFrom(before)); err != nil {
		t.Errorf("its own node's NodeRepair status: %v", err)
	}

	// Another node: refused, with the reason.
	wantForbidden(t, "gpu-001's status", a.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[1]}}, conditionPatch(2)),
		"the gpufleet agent of node gpu-000 may not write nodes of node gpu-001")
	wantForbidden(t, "a GPUFault of gpu-001", a.Create(ctx, gpuFault(nodes[1])), "may not write gpufaults of node gpu-001")
	other := &repairv1.NodeRepair{}
	if err := a.Get(ctx, client.ObjectKey{Name: "repair-" + nodes[1]}, other); err != nil {
		t.Fatal(err)
	}
	before = other.DeepCopy()
	other.Status.Pending = &repairv1.PendingAction{Action: repairv1.ActionReboot, RequestedAt: metav1.NewTime(time.Now().Truncate(time.Second))}
	wantForbidden(t, "a pending reboot on gpu-001's NodeRepair", a.Status().Patch(ctx, other, client.MergeFrom(before)), "may not write noderepairs of node gpu-001")

	// A token bound to no node: refused everywhere.
	wantForbidden(t, "unbound token, gpu-000's status", unbound.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[0]}}, conditionPatch(3)),
		"bound to no node")

	// Everyone else is not concerned (the operator, an administrator).
	if err := env.Kube.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[1]}}, conditionPatch(4)); err != nil {
		t.Errorf("an administrator writing gpu-001's status: %v", err)
	}
}

// TestDeviceTaintRuleMustNameAPool: with the policy in place, a
// DeviceTaintRule that names no pool is refused from anyone (an
// administrator here), and one naming a pool and device is accepted.
func TestDeviceTaintRuleMustNameAPool(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	apply(t, agentconfig.DeviceTaintRuleScope)
	rule := func(name string, sel *resourcev1.DeviceTaintSelector) *resourcev1.DeviceTaintRule {
		return &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourcev1.DeviceTaintRuleSpec{DeviceSelector: sel,
				Taint: resourcev1.DeviceTaint{Key: "example.com/broken", Effect: resourcev1.DeviceTaintEffectNoSchedule}}}
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := env.Kube.Create(ctx, rule("everything", &resourcev1.DeviceTaintSelector{}), client.DryRunAll)
		return apierrors.IsForbidden(err) || apierrors.IsInvalid(err), nil
	})
	if err != nil {
		t.Fatal("an empty DeviceTaintRule selector was still accepted after 30 s: the policy is not in force")
	}
	wantForbidden(t, "a driver-wide rule", env.Kube.Create(ctx, rule("driver-wide", &resourcev1.DeviceTaintSelector{Driver: ptr.To("gpu.nvidia.com")})),
		"must name the pool")
	wantForbidden(t, "a device name in every pool", env.Kube.Create(ctx, rule("gpu-0-everywhere", &resourcev1.DeviceTaintSelector{Device: ptr.To("gpu-0")})),
		"must name the pool")
	one := rule("one-gpu", &resourcev1.DeviceTaintSelector{Driver: ptr.To("gpu.nvidia.com"), Pool: ptr.To(nodes[0]), Device: ptr.To("gpu-0")})
	if err := env.Kube.Create(ctx, one); err != nil {
		t.Errorf("a rule naming one device: %v", err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), one) })
}

// TestTheAgentChangesOnlyItsOwnCondition: on its own node's status, the
// agent's real bound token writes its GPUProblem condition, and nothing
// else: a label (a repair pool, a node-restriction.kubernetes.io/ one), an
// annotation (the repair's fault clock), the node's capacity and the
// kubelet's Ready condition are refused — all of which the status
// subresource would otherwise keep.
func TestTheAgentChangesOnlyItsOwnCondition(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	apply(t, agentconfig.RBAC)
	apply(t, agentconfig.AgentOwnNode)
	a := as(t, agentToken(t, nodes[0]))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[0]}}
	statusPatch := func(body string) error {
		return a.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, []byte(body)))
	}
	// The policy is in force once the API server has loaded it (each try
	// a new value, so that none is a no-op).
	tries := 0
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		tries++
		err := statusPatch(fmt.Sprintf(`{"metadata":{"labels":{"test.gpufleet.dev/try":"%d"}}}`, tries))
		return apierrors.IsForbidden(err) || apierrors.IsInvalid(err), nil
	})
	if err != nil {
		t.Fatal("the agent could still relabel its node through nodes/status after 30 s")
	}
	for what, body := range map[string]string{
		"move its node to another repair pool":       `{"metadata":{"labels":{"gpufleet.dev/pool":"elsewhere"}}}`,
		"set a label the kubelet itself may not set": `{"metadata":{"labels":{"node-restriction.kubernetes.io/trusted":"true"}}}`,
		"rewrite the repair's fault clock":           `{"metadata":{"annotations":{"repair.gpufleet.dev/faults-since":"{}"}}}`,
		"offer more GPUs":                            `{"status":{"capacity":{"nvidia.com/gpu":"64"},"allocatable":{"nvidia.com/gpu":"64"}}}`,
	} {
		wantForbidden(t, what, statusPatch(body), "the gpufleet agent may not change")
	}
	ready := client.RawPatch(types.StrategicMergePatchType, []byte(
		`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"ByTheAgent","message":"forged","lastHeartbeatTime":null,"lastTransitionTime":"2026-12-06T00:00:00Z"}]}}`))
	wantForbidden(t, "the kubelet's Ready condition", a.Status().Patch(ctx, node, ready), "may change only its own node conditions (GPUProblem)")
	if err := a.Status().Patch(ctx, node, conditionPatch(9)); err != nil {
		t.Errorf("its own GPUProblem condition: %v", err)
	}
	got := &corev1.Node{}
	if err := env.Kube.Get(ctx, client.ObjectKeyFromObject(node), got); err != nil {
		t.Fatal(err)
	}
	if got.Labels["gpufleet.dev/pool"] == "elsewhere" || got.Labels["node-restriction.kubernetes.io/trusted"] != "" {
		t.Errorf("labels after the refused writes: %v", got.Labels)
	}
}

// TestTheOperatorMayChangeOnlyThePodsDrainLabel: the operator's real
// ServiceAccount token, with its generated ClusterRole (which may patch
// pods everywhere, to label the pods a GPU repair drains), puts that label
// on a pod and takes it off; it may not change the pod's image (which would
// run code as the pod's ServiceAccount), another label, or an annotation.
func TestTheOperatorMayChangeOnlyThePodsDrainLabel(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	policy, err := gpufleetconfig.RBAC.ReadFile("rbac/operator-pod-label.yaml")
	if err != nil {
		t.Fatal(err)
	}
	apply(t, policy)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpufleet-operator"}}
	if err := env.Kube.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gpufleet-operator-sa"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa.Name}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gpufleet-operator"}}
	if err := env.Kube.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	op := as(t, tr.Status.Token)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "training-job", Labels: map[string]string{"app": "train"}},
		Spec: corev1.PodSpec{NodeName: nodes[0], Containers: []corev1.Container{{Name: "c", Image: "registry.example/train:1"}}}}
	if err := env.Kube.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
	patch := func(body string) error {
		return op.Patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: pod.Name}}, client.RawPatch(types.StrategicMergePatchType, []byte(body)))
	}
	// Until the API server has loaded the policy, a change goes through:
	// each try is a new image, so that none is a no-op.
	tries := 0
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		tries++
		err := patch(fmt.Sprintf(`{"spec":{"containers":[{"name":"c","image":"registry.example/evil:%d"}]}}`, tries))
		return apierrors.IsForbidden(err) || apierrors.IsInvalid(err), nil
	})
	if err != nil {
		t.Fatal("the operator's token could still change a pod's image after 30 s")
	}
	if err := patch(`{"metadata":{"labels":{"repair.gpufleet.dev/gpu-drain":"uid-1"}}}`); err != nil {
		t.Errorf("the GPU drain's label: %v", err)
	}
	if err := patch(`{"metadata":{"labels":{"repair.gpufleet.dev/gpu-drain":null}}}`); err != nil {
		t.Errorf("the GPU drain's label taken off: %v", err)
	}
	wantForbidden(t, "another label", patch(`{"metadata":{"labels":{"app":"other"}}}`), "may change only the label repair.gpufleet.dev/gpu-drain")
	wantForbidden(t, "an annotation", patch(`{"metadata":{"annotations":{"x":"y"}}}`), "may not change a pod's annotations")
	got := &corev1.Pod{}
	if err := env.Kube.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
		t.Fatal(err)
	}
	if got.Labels["app"] != "train" {
		t.Errorf("the pod after the refused writes: labels %v", got.Labels)
	}
}

// TestTheOperatorsMetricsNeedAnAuthorizedToken: the operator, as the
// `gpufleet operator` command runs it by default (--metrics-secure),
// serves its metrics and pprof over HTTPS only, and only to a token the
// API server authenticates and authorizes: none gets 401, a
// ServiceAccount without the metrics-reader ClusterRole gets 403, one
// bound to it reads /metrics — and still not pprof.
func TestTheOperatorsMetricsNeedAnAuthorizedToken(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	devtest.StartOperator(t, env.OperatorConfig, operator.Options{Namespace: ns, Capabilities: []string{"maintenance"},
		MetricsAddr: addr, MetricsSecure: true, Profiling: true})
	reader, err := gpufleetconfig.RBAC.ReadFile("rbac/metrics_reader_role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	apply(t, reader)
	token := func(name string, bound bool) string {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := env.Kube.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if bound {
			b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: name}},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gpufleet-metrics-reader"}}
			if err := env.Kube.Create(ctx, b); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
		tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	prometheus, stranger := token("prometheus", true), token("stranger", false)
	// The operator's certificate is self-signed: the token is what counts.
	httpsClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test checks authentication, not the certificate
	get := func(scheme, path, bearer string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := httpsClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	var code int
	var body string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		code, body = get("https", "/metrics", prometheus)
		return code == http.StatusOK, nil
	})
	if err != nil || !strings.Contains(body, "gpufleet_") {
		t.Fatalf("an authorized token reading /metrics: %d %.200s", code, body)
	}
	for what, tc := range map[string]struct {
		scheme, path, token string
		want                int
	}{
		"plain HTTP":                        {"http", "/metrics", "", http.StatusBadRequest},
		"no token":                          {"https", "/metrics", "", http.StatusUnauthorized},
		"a token without the reader's role": {"https", "/metrics", stranger, http.StatusForbidden},
		"the reader's token on pprof":       {"https", "/debug/pprof/", prometheus, http.StatusForbidden},
		"no token on pprof":                 {"https", "/debug/pprof/", "", http.StatusUnauthorized},
		// controller-runtime's filter answers a token the API server cannot
		// read with 500 "Authentication failed".
		"a token that is not one": {"https", "/metrics", "not-a-token", http.StatusInternalServerError},
	} {
		if code, body := get(tc.scheme, tc.path, tc.token); code != tc.want || strings.Contains(body, "gpufleet_") {
			t.Errorf("%s: %d %.120q, want %d and no metrics", what, code, body, tc.want)
		}
	}
}
