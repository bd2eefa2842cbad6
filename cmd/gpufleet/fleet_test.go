package main

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFleetCommandsDoNotImportTheGPUStackController: the fleet commands'
// files (status, explain, ui) import the GPU stack's API, never
// internal/gpustack (issue 32). internal/fleet's
// TestFleetViewDoesNotLinkTheGPUStackController holds the view itself;
// .golangci.yml's depguard rule fleet-view-off-the-gpu-stack-controller
// holds both. The binary links the controller through the operator
// command: this is about these files alone.
func TestFleetCommandsDoNotImportTheGPUStackController(t *testing.T) {
	files, err := filepath.Glob("fleet*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fleet*.go in cmd/gpufleet (%v)", err)
	}
	const forbidden = "github.com/gpufleet/gpufleet/internal/gpustack"
	for _, name := range files {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if path == forbidden || strings.HasPrefix(path, forbidden+"/") {
				t.Errorf("%s imports %s: use the GPU stack's API, api/nvidia/v1 (stack.go)", name, path)
			}
		}
	}
}

func TestIsPlugin(t *testing.T) {
	tests := map[string]bool{
		"kubectl-gpufleet":                true,
		"/usr/local/bin/kubectl-gpufleet": true,
		`C:\bin\kubectl-gpufleet.exe`:     false, // a Windows path is not split on Linux
		"kubectl-gpufleet.exe":            true,
		"gpufleet":                        false,
		"/usr/local/bin/gpufleet":         false,
		"kubectl-gpufleet-other":          false,
	}
	for argv0, want := range tests {
		if got := isPlugin(argv0); got != want {
			t.Errorf("isPlugin(%q) = %t, want %t", argv0, got, want)
		}
	}
}

func TestPluginCommands(t *testing.T) {
	root := newPluginCommand()
	var names []string
	for _, c := range root.Commands() {
		names = append(names, c.Name())
	}
	if got := strings.Join(names, ","); got != "explain,status,takeover,ui,uninstall,version" {
		t.Errorf("plugin commands %s, want explain,status,takeover,ui,uninstall,version (no operator, agent, dev or sim)", got)
	}
}

func TestFleetCommandsRefuseBadInput(t *testing.T) {
	tests := map[string]struct {
		args    []string
		wantErr string
	}{
		"a bad selector":           {[]string{"status", "-l", "a=(b"}, "-l"},
		"an unknown sort order":    {[]string{"status", "--sort-by", "age"}, `--sort-by "age"`},
		"an unknown output format": {[]string{"status", "-o", "xml"}, `-o "xml"`},
		"explain without a node":   {[]string{"explain"}, "accepts 1 arg"},
		"explain as a table":       {[]string{"explain", "n", "-o", "wide"}, `-o "wide"`},
		"status with arguments":    {[]string{"status", "gpu-000"}, "unknown command"},
		"no cluster":               {[]string{"status", "--kubeconfig", "/nonexistent/kubeconfig"}, "kubeconfig"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := run(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.wantErr)
			}
		})
	}
}

func TestCommandOf(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
	}{
		"status":              {[]string{"status", "-o", "wide"}, "status"},
		"after a flag":        {[]string{"--help", "explain", "gpu-000"}, "explain"},
		"a node named status": {[]string{"explain", "status"}, "explain"},
		"no command":          {nil, ""},
	}
	for name, tc := range tests {
		if got := commandOf(tc.args); got != tc.want {
			t.Errorf("%s: commandOf(%q) = %q, want %q", name, tc.args, got, tc.want)
		}
	}
}
