package cli

import (
	"os"
	"path/filepath"
	"testing"
)

func TestKubeconfigHasNoClientSideRateLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := RestConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS >= 0 {
		t.Errorf("QPS %v: client-go's default 5/s limit would throttle the operator", cfg.QPS)
	}
	if _, err := RestConfig(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing kubeconfig must be an error")
	}
}
