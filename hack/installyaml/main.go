// Command installyaml writes the release's install.yaml: `kustomize build
// config/default` (CRDs, RBAC, the operator, the node agent, the namespace)
// with the image tag of the release (make release, hack/release.sh).
//
//	go run ./hack/installyaml -tag 0.2.0 > install.yaml
//
// It builds an overlay of config/default in a temporary directory that sets
// the tag of the image named in config/default's `images:`, so the
// repository stays the one config/default names.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "installyaml:", err)
		os.Exit(1)
	}
}

func run() error {
	base := flag.String("config", "config/default", "the kustomization to build")
	tag := flag.String("tag", "", "the image tag of the release (required)")
	flag.Parse()
	if *tag == "" {
		return fmt.Errorf("-tag is required")
	}
	abs, err := filepath.Abs(*base)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(abs, "kustomization.yaml"))
	if err != nil {
		return err
	}
	var k types.Kustomization
	if err := yaml.Unmarshal(data, &k); err != nil {
		return fmt.Errorf("%s/kustomization.yaml: %w", *base, err)
	}
	if len(k.Images) != 1 {
		return fmt.Errorf("%s/kustomization.yaml names %d images, want gpufleet's only", *base, len(k.Images))
	}
	image := k.Images[0].Name

	overlay, err := os.MkdirTemp("", "installyaml-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(overlay) }()
	rel, err := filepath.Rel(overlay, abs)
	if err != nil {
		return err
	}
	o := types.Kustomization{
		TypeMeta:  types.TypeMeta{APIVersion: types.KustomizationVersion, Kind: types.KustomizationKind},
		Resources: []string{rel},
		Images:    []types.Image{{Name: image, NewTag: *tag}},
	}
	data, err = yaml.Marshal(o)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), data, 0o644); err != nil {
		return err
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		return fmt.Errorf("kustomize build %s: %w", *base, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		return err
	}
	fmt.Printf("# gpufleet %s: CRDs, RBAC, the operator and the node agent (kustomize build %s).\n", *tag, *base)
	fmt.Printf("# kubectl apply --server-side -f install.yaml\n")
	_, err = os.Stdout.Write(out)
	return err
}
