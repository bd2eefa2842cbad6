package devcluster

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Connect returns a Cluster for a local cluster that another process runs
// (e.g. `gpufleet dev`), from its admin kubeconfig: its fault-injection
// methods (InjectXID, SetGPUState, SetNodeCondition, Reboot, …) work on it;
// it cannot be stopped from here.
func Connect(kubeconfig string) (*Cluster, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig of the local cluster: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Cluster{Kubeconfig: kubeconfig, Config: cfg, Client: cs, APIServerURL: cfg.Host}, nil
}
