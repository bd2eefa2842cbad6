package takeover

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	clienttesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpufleet/gpufleet/internal/operator"
)

// The runner's steps against a fake client (the API server's part is in
// test/takeover): the way back scales gpufleet to 0 and the GPU Operator
// back to its replicas; a lease that stays held ends the wait with
// ErrStillRunning; a problem changes nothing.
func TestRun(t *testing.T) {
	scheme, err := operator.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	stoppedGPUOp := deployment(stackNS, "gpu-operator", 0, gpuOperatorHelmLabels)
	stoppedGPUOp.Annotations = map[string]string{AnnotationScaledDownFrom: "3"}
	held := lease(stackNS, liveowner53822513, "gpu-operator-abc")
	held.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
	tests := map[string]struct {
		objs    []client.Object
		dir     Direction
		wantErr error
		want    map[string]string // Deployment → "replicas annotation"
	}{
		"back to the GPU Operator": {
			objs: []client.Object{ptr.To(deployment(stackNS, "gpufleet-operator", 2, nil)), &stoppedGPUOp,
				ptr.To(lease(stackNS, "gpufleet-operator", ""))},
			dir:  Direction{Operator: GPUOperator, Back: true},
			want: map[string]string{"gpufleet-operator": "0 2", "gpu-operator": "3 "},
		},
		"the GPU Operator keeps its lease": {
			objs:    []client.Object{ptr.To(deployment(stackNS, "gpufleet-operator", 2, nil)), ptr.To(deployment(stackNS, "gpu-operator", 1, gpuOperatorHelmLabels)), &held},
			dir:     Direction{Operator: GPUOperator},
			wantErr: ErrStillRunning,
			want:    map[string]string{"gpufleet-operator": "2 ", "gpu-operator": "0 1"},
		},
		"no gpufleet: nothing changes": {
			objs:    []client.Object{ptr.To(deployment(stackNS, "gpu-operator", 1, gpuOperatorHelmLabels))},
			dir:     Direction{Operator: GPUOperator},
			wantErr: ErrProblems,
			want:    map[string]string{"gpu-operator": "1 "},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.objs...).
				WithIndex(&coordinationv1.Lease{}, "metadata.name", func(o client.Object) []string { return []string{o.GetName()} }).Build()
			var out bytes.Buffer
			err := Run(t.Context(), Options{Client: c, Direction: tc.dir, Namespace: stackNS, Deployment: "gpufleet-operator",
				Out: &out, Clock: clienttesting.NewFakePassiveClock(now), Timeout: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Run: %v, want %v\n%s", err, tc.wantErr, out.String())
			}
			for name, want := range tc.want {
				d := &appsv1.Deployment{}
				if err := c.Get(t.Context(), client.ObjectKey{Namespace: stackNS, Name: name}, d); err != nil {
					t.Fatal(err)
				}
				if got := fmt.Sprintf("%d %s", *d.Spec.Replicas, d.Annotations[AnnotationScaledDownFrom]); got != want {
					t.Errorf("Deployment %s: %q, want %q", name, got, want)
				}
			}
		})
	}
}
