package fleet

import (
	"bytes"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func event(kind, ns, name, typ, reason, message string, at time.Duration, count int32) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "default", Name: name + "." + reason},
		InvolvedObject: corev1.ObjectReference{Kind: kind, Namespace: ns, Name: name},
		Type:           typ, Reason: reason, Message: message, Count: count,
		FirstTimestamp: ago(at + time.Minute), LastTimestamp: ago(at),
	}
}

func TestExplainGolden(t *testing.T) {
	s := fleetSnapshot()
	// gpu-002: draining for a driver upgrade, a human waits; gpu-004: a
	// repair that failed.
	s.Events = []*corev1.Event{
		event("NodeMaintenance", "default", "upgrade-2", corev1.EventTypeNormal, "Draining", "evicting 4 pods", 4*time.Minute, 1),
		event("NodeMaintenance", "default", "upgrade-2", corev1.EventTypeWarning, "EvictionRefused", "PDB ml/train\nallows no disruption", 90*time.Second, 7),
		event("Node", "", "gpu-002", corev1.EventTypeNormal, "NodeNotSchedulable", "Node gpu-002 status is now: NodeNotSchedulable", 4*time.Minute, 1),
	}
	for _, node := range []string{"gpu-002", "gpu-004", "gpu-006"} {
		t.Run(node, func(t *testing.T) {
			st, err := Explain(s, node, now)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := WriteStory(&out, st, now); err != nil {
				t.Fatal(err)
			}
			golden(t, "explain-"+node+".golden", out.Bytes())
			for i := 1; i < len(st.Entries); i++ {
				if st.Entries[i].Time.After(st.Entries[i-1].Time.Time) {
					t.Errorf("entry %d (%s) is newer than the one before it", i, st.Entries[i].What)
				}
			}
		})
	}
}

func TestExplainUnknownNode(t *testing.T) {
	_, err := Explain(fleetSnapshot(), "gpu-999", now)
	var unknown *ErrUnknownNode
	if !errors.As(err, &unknown) || unknown.Node != "gpu-999" {
		t.Errorf("error %v, want an unknown node gpu-999", err)
	}
}

func TestStoryOutputs(t *testing.T) {
	st, err := Explain(fleetSnapshot(), "gpu-003", now)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{OutputJSON, OutputYAML} {
		var out bytes.Buffer
		if err := WriteStoryAs(&out, st, o, now); err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(out.Bytes(), []byte("NodeStory")) || !bytes.Contains(out.Bytes(), []byte("kubelet-down")) {
			t.Errorf("-o %s lacks the kind or the fault:\n%s", o, out.String())
		}
	}
}
