package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	uzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

func TestParseLogLevel(t *testing.T) {
	tests := map[string]struct {
		want    zapcore.Level
		wantErr bool
	}{
		"debug":   {want: zapcore.DebugLevel},
		"info":    {want: zapcore.InfoLevel},
		"error":   {want: zapcore.ErrorLevel},
		"":        {wantErr: true},
		"DEBUG":   {wantErr: true},
		"verbose": {wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseLogLevel(name)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ParseLogLevel(%q) = %v, %v; want %v (error: %t)", name, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestLogLevelsGateLines checks what each level lets through a
// controller-runtime zap logger: debug includes V(1), error drops Info.
func TestLogLevelsGateLines(t *testing.T) {
	tests := map[string]struct{ want []string }{
		"debug": {want: []string{"v1", "info", "error"}},
		"info":  {want: []string{"info", "error"}},
		"error": {want: []string{"error"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l, err := ParseLogLevel(name)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			log := zap.New(zap.Level(uzap.NewAtomicLevelAt(l)), zap.WriteTo(&buf))
			log.V(2).Info("v2")
			log.V(1).Info("v1")
			log.Info("info")
			log.Error(nil, "error")
			var got []string
			for line := range strings.Lines(buf.String()) {
				var m struct{ Msg string }
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				got = append(got, m.Msg)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLogLevelReconcilerFollowsTheConfig(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := maintenancev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	const ns = "gpufleet-system"
	config := func(namespace, level string) client.Object {
		return &maintenancev1.MaintenanceOperatorConfig{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: maintenancev1.DefaultConfigName},
			Spec:       maintenancev1.MaintenanceOperatorConfigSpec{LogLevel: maintenancev1.LogLevel(level)},
		}
	}
	type line struct{ Msg, From, To, Error string }
	// Steps run in order against one level that starts at the command
	// line's default, info.
	steps := []struct {
		name      string
		objects   []client.Object
		want      zapcore.Level
		wantLines []line
	}{
		{name: "config missing: the default", want: zapcore.InfoLevel},
		{name: "debug", objects: []client.Object{config(ns, "debug")}, want: zapcore.DebugLevel,
			wantLines: []line{{Msg: "log level changed", From: "info", To: "debug"}}},
		{name: "unchanged: no line", objects: []client.Object{config(ns, "debug")}, want: zapcore.DebugLevel},
		{name: "unknown value keeps the level", objects: []client.Object{config(ns, "verbose")}, want: zapcore.DebugLevel,
			wantLines: []line{{Msg: "keeping the current log level", Error: `unknown log level "verbose" (want debug, info or error)`}}},
		{name: "debug to error", objects: []client.Object{config(ns, "error")}, want: zapcore.ErrorLevel,
			wantLines: []line{{Msg: "log level changed", From: "debug", To: "error"}}},
		{name: "config deleted: the default", want: zapcore.InfoLevel,
			wantLines: []line{{Msg: "log level changed", From: "error", To: "info"}}},
		{name: "another namespace's config does not count", objects: []client.Object{config("elsewhere", "debug")}, want: zapcore.InfoLevel},
		{name: "error again", objects: []client.Object{config(ns, "error")}, want: zapcore.ErrorLevel,
			wantLines: []line{{Msg: "log level changed", From: "info", To: "error"}}},
		{name: "empty: the default", objects: []client.Object{config(ns, "")}, want: zapcore.InfoLevel,
			wantLines: []line{{Msg: "log level changed", From: "error", To: "info"}}},
	}
	level := uzap.NewAtomicLevelAt(zapcore.InfoLevel)
	r := &LogLevelReconciler{Namespace: ns, Level: &level, Default: zapcore.InfoLevel}
	for _, step := range steps {
		var lines []line
		log := funcr.NewJSON(func(obj string) {
			var l line
			if err := json.Unmarshal([]byte(obj), &l); err != nil {
				t.Errorf("log line %s: %v", obj, err)
			}
			lines = append(lines, l)
		}, funcr.Options{})
		r.Client = fake.NewClientBuilder().WithScheme(scheme).WithObjects(step.objects...).Build()
		req := reconcile.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: maintenancev1.DefaultConfigName}}
		if _, err := r.Reconcile(logr.NewContext(context.Background(), log), req); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := level.Level(); got != step.want {
			t.Errorf("%s: level %v, want %v", step.name, got, step.want)
		}
		if diff := cmp.Diff(step.wantLines, lines); diff != "" {
			t.Errorf("%s: log lines (-want +got):\n%s", step.name, diff)
		}
	}
}
