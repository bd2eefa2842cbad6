package statusmemo

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/types"
)

type status struct {
	State      string
	Components []string
}

func TestMemo(t *testing.T) {
	var m Memo[status]
	written := status{State: "ready", Components: []string{"a"}}
	if m.Unchanged("u1", "10", written) {
		t.Fatal("nothing written yet, but unchanged")
	}
	m.Written("u1", "11", written)
	for name, tc := range map[string]struct {
		uid, rv string
		st      status
		want    bool
	}{
		"the same status, the object as written (fields pruned by the server)": {"u1", "11", written, true},
		"the object changed since (another writer, a spec edit)":               {"u1", "12", written, false},
		"another status":            {"u1", "11", status{State: "notReady", Components: []string{"a"}}, false},
		"another object":            {"u2", "11", written, false},
		"no resourceVersion (fake)": {"u1", "", written, false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := m.Unchanged(types.UID(tc.uid), tc.rv, tc.st); got != tc.want {
				t.Errorf("Unchanged = %t, want %t", got, tc.want)
			}
		})
	}
	m.Forget("u1")
	if m.Unchanged("u1", "11", written) {
		t.Error("forgotten, but unchanged")
	}
}

// A condition's time is sent to the second: the status computed again from
// the stored one (its times truncated) is the one written.
func TestMemoComparesWhatIsSent(t *testing.T) {
	type st struct{ Conditions []metav1.Condition }
	now := time.Date(2026, 12, 6, 16, 23, 28, 398_000_000, time.UTC)
	var m Memo[st]
	m.Written("u", "7", st{Conditions: []metav1.Condition{{Type: "Ready", Status: "True", LastTransitionTime: metav1.NewTime(now)}}})
	again := st{Conditions: []metav1.Condition{{Type: "Ready", Status: "True", LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))}}}
	if !m.Unchanged("u", "7", again) {
		t.Error("the same status, read back with its time to the second, counts as changed")
	}
}
