package agentcmd

import (
	"bytes"
	"strings"
	"testing"
)

// TestCommandRefusesBadInput: the agent command, under either name, refuses
// to start without a node or with a dcgm-exporter interval of zero, and
// changes nothing doing so.
func TestCommandRefusesBadInput(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	tests := map[string]struct {
		args    []string
		wantErr string
	}{
		"without a node":              {nil, "--node-name or $NODE_NAME is required"},
		"reading dcgm all the time":   {[]string{"--node-name", "n", "--dcgm-interval", "0s"}, "--dcgm-interval must be positive"},
		"an unknown flag":             {[]string{"--no-such-flag"}, "unknown flag"},
		"a kubeconfig that is absent": {[]string{"--node-name", "n", "--kubeconfig", "/nonexistent/kubeconfig"}, "loading kubeconfig"},
	}
	for _, use := range []string{"agent", "gpufleet-agent"} {
		for name, tc := range tests {
			t.Run(use+"/"+name, func(t *testing.T) {
				cmd := NewCommand(use)
				var out bytes.Buffer
				cmd.SetOut(&out)
				cmd.SetErr(&out)
				cmd.SetArgs(tc.args)
				err := cmd.Execute()
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("%s %v: error %v, want one containing %q", use, tc.args, err, tc.wantErr)
				}
			})
		}
	}
}
