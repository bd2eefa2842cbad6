package uninstall

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestWaitStopped covers the wait's ends: the operator stops; it keeps
// running while some reads fail (a read cut short by the timeout must
// still report the running operator, as CI once saw it not do); every
// read fails.
func TestWaitStopped(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "op"},
		Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}}},
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "op-1", Labels: map[string]string{"app": "op"}}}
	tests := map[string]struct {
		objs     []client.Object
		failRead func(n int64) bool
		wantErr  error
		wantMsg  string
	}{
		"stopped":                       {objs: []client.Object{deploy}},
		"running":                       {objs: []client.Object{deploy, pod}, wantErr: ErrOperatorRunning, wantMsg: "pods op-1 still exist"},
		"running, every other read cut": {objs: []client.Object{deploy, pod}, failRead: func(n int64) bool { return n%2 == 0 }, wantErr: ErrOperatorRunning, wantMsg: "pods op-1 still exist"},
		"every read fails":              {objs: []client.Object{deploy}, failRead: func(int64) bool { return true }, wantErr: ErrOperatorRunning, wantMsg: "the last look failed"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var reads atomic.Int64
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tt.objs...).WithInterceptorFuncs(interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if tt.failRead != nil && tt.failRead(reads.Add(1)) {
						return context.DeadlineExceeded
					}
					return c.Get(ctx, key, obj, opts...)
				},
			}).Build()
			o := Options{Client: c, Namespace: "ns", Deployment: "op", Lease: "op", Timeout: 50 * time.Millisecond, PollInterval: 5 * time.Millisecond}
			err := waitStopped(context.Background(), o, func(string, ...any) {})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("waitStopped = %v, want %v", err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("waitStopped = %q, want it to say %q", err, tt.wantMsg)
			}
		})
	}
}
