package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"
)

func TestLogLevelFlag(t *testing.T) {
	tests := map[string]struct {
		name        string
		development bool
		want        zapcore.Level
		wantErr     bool
	}{
		"default":                     {want: zapcore.InfoLevel},
		"development logs":            {development: true, want: zapcore.DebugLevel},
		"named level wins":            {name: "error", development: true, want: zapcore.ErrorLevel},
		"debug":                       {name: "debug", want: zapcore.DebugLevel},
		"an unknown level is refused": {name: "verbose", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := logLevel(tc.name, tc.development)
			if (err != nil) != tc.wantErr {
				t.Fatalf("logLevel(%q, %t) error %v, want error %t", tc.name, tc.development, err, tc.wantErr)
			}
			if err == nil && got != tc.want {
				t.Errorf("logLevel(%q, %t) = %s, want %s", tc.name, tc.development, got, tc.want)
			}
		})
	}
}

// run executes the root command with args and returns its output and error.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestVersionCommand(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || !strings.HasPrefix(out, "gpufleet ") || !strings.Contains(out, "commit ") {
		t.Errorf("version: %q, %v", out, err)
	}
}

func TestCommandsRefuseBadInput(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	tests := map[string]struct {
		args    []string
		wantErr string
	}{
		"agent without a node":            {[]string{"agent"}, "--node-name or $NODE_NAME is required"},
		"agent reading dcgm all the time": {[]string{"agent", "--node-name", "n", "--dcgm-interval", "0s"}, "--dcgm-interval must be positive"},
		"operator with a bad log level":   {[]string{"operator", "--log-level", "loud"}, "--log-level"},
		"an unknown flag":                 {[]string{"operator", "--no-such-flag"}, "unknown flag"},
		"an unknown subcommand":           {[]string{"frobnicate"}, "unknown command"},
		"takeover without a direction":    {[]string{"takeover"}, "--from or --to is required"},
		"takeover both ways":              {[]string{"takeover", "--from", "gpu-operator", "--to", "gpu-operator"}, "exclude each other"},
		"takeover from an unknown one":    {[]string{"takeover", "--from", "network-operator"}, `unknown operator "network-operator"`},
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
