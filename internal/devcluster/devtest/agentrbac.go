package devtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	agentconfig "github.com/gpufleet/gpufleet/config/agent"
)

// InstallAgentRBAC creates the node agent's ClusterRole and binding from
// config/agent/rbac.yaml (exactly what is shipped); removed at cleanup.
func InstallAgentRBAC(tb testing.TB, kube client.Client) {
	tb.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(agentconfig.RBAC), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			tb.Fatal(err)
		}
		data, err := yaml.Marshal(raw)
		if err != nil {
			tb.Fatal(err)
		}
		var obj client.Object
		switch raw["kind"] {
		case "ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		default:
			continue
		}
		if err := yaml.UnmarshalStrict(data, obj); err != nil {
			tb.Fatal(err)
		}
		if err := kube.Create(context.Background(), obj); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = kube.Delete(context.Background(), obj) })
	}
}
