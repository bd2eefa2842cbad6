package agent

import (
	"fmt"
	"regexp"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// pciBusID is the schema's pattern of a GPU's PCI address: what the agent
// passes to nvidia-smi -i.
var pciBusID = regexp.MustCompile(`^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)

// Unusable says why the agent cannot act on a repair's pending action (""
// when it can): a value the API server's schema refuses today, written
// under an older schema, by a client that skips validation, or forged. The
// agent records such an action refused, with this reason, instead of
// acting on it or crashing on it (pure).
func Unusable(nr *repairv1.NodeRepair) string {
	p := nr.Status.Pending
	if p == nil {
		return ""
	}
	if !p.Action.Known() {
		return fmt.Sprintf("refused: %q is not an action the node agent knows", p.Action)
	}
	if n := nr.Status.NextAction; n < 0 || int(n) > len(nr.Spec.Actions) {
		return fmt.Sprintf("refused: status.nextAction %d is outside spec.actions (%d actions)", n, len(nr.Spec.Actions))
	}
	gpuAction := p.Action == repairv1.ActionResetGPU || p.Action == repairv1.ActionValidateGPU
	if gpuAction && len(nr.Spec.GPUs) == 0 {
		return fmt.Sprintf("refused: %s names no GPU (spec.gpus)", p.Action)
	}
	for i, g := range nr.Spec.GPUs {
		switch {
		case g.PCIBusID == "" && gpuAction:
			return fmt.Sprintf("refused: spec.gpus[%d] has no PCI bus ID: %s needs one", i, p.Action)
		case g.PCIBusID != "" && !pciBusID.MatchString(g.PCIBusID):
			return fmt.Sprintf("refused: spec.gpus[%d].pciBusID %q is not a PCI address", i, g.PCIBusID)
		}
	}
	return ""
}
