package v1alpha1

import "testing"

func TestRecorded(t *testing.T) {
	tests := map[string]struct {
		spec NodeRepairSpec
		want bool
	}{
		"a repair to run":  {NodeRepairSpec{NodeName: "n", Actions: []Action{ActionRestartNTP}}, false},
		"a dry-run record": {NodeRepairSpec{NodeName: "n", DryRun: true}, true},
		"an ignored fault": {NodeRepairSpec{NodeName: "n", IgnoreReason: "node is being deleted"}, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := (&NodeRepair{Spec: tc.spec}).Recorded(); got != tc.want {
				t.Errorf("Recorded() = %t, want %t", got, tc.want)
			}
		})
	}
}
