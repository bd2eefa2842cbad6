package pendingevents

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
)

func drain(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestFlushEmitsInOrderOnce(t *testing.T) {
	fake := events.NewFakeRecorder(10)
	r := New(fake)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}
	r.Eventf(node, nil, corev1.EventTypeNormal, "Cordoned", "Cordon", "Cordoned node %s", "gpu-1")
	r.Eventf(node, nil, corev1.EventTypeWarning, "DrainBlocked", "Drain", "%d pods block", 2)
	if got := drain(fake); len(got) != 0 || r.Len() != 2 {
		t.Fatalf("before Flush: emitted %v, waiting %d; want nothing emitted, 2 waiting", got, r.Len())
	}
	r.Flush()
	want := []string{"Normal Cordoned Cordoned node gpu-1", "Warning DrainBlocked 2 pods block"}
	if diff := cmp.Diff(want, drain(fake)); diff != "" {
		t.Errorf("emitted (-want +got):\n%s", diff)
	}
	r.Flush()
	if got := drain(fake); len(got) != 0 {
		t.Errorf("a second Flush emitted %v again", got)
	}
}

func TestDropForgets(t *testing.T) {
	fake := events.NewFakeRecorder(10)
	r := New(fake)
	r.Eventf(&corev1.Node{}, nil, corev1.EventTypeNormal, "Ready", "Release", "ready")
	r.Drop()
	r.Flush()
	if got := drain(fake); len(got) != 0 || r.Len() != 0 {
		t.Errorf("after Drop: emitted %v, waiting %d; want nothing", got, r.Len())
	}
}
