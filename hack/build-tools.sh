#!/usr/bin/env bash
# Builds the pinned tools and control-plane binaries into bin/ from the Go
# module proxy. Each tool lives in its own module under hack/tools/<name> so
# that its dependencies never leak into the product's go.mod. A tool is
# rebuilt only when its module (go.mod/go.sum) or build flags change.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/bin"
mkdir -p "$bin"

k8s_version=v1.37.2
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean"

# build NAME LDFLAGS OUTPUT... -- PACKAGE...
build() {
  local name=$1 ldflags=$2; shift 2
  local outs=() pkgs=()
  while [ "$1" != "--" ]; do outs+=("$1"); shift; done; shift
  pkgs=("$@")
  local dir="$root/hack/tools/$name"
  local stamp="$bin/.stamp-$name"
  local want
  want=$( { cat "$dir/go.mod" "$dir/go.sum"; echo "$ldflags"; go version; } | sha256sum | cut -d' ' -f1)
  local have=""
  [ -f "$stamp" ] && have=$(cat "$stamp")
  local missing=0
  for o in "${outs[@]}"; do [ -x "$bin/$o" ] || missing=1; done
  if [ "$missing" = 0 ] && [ "$have" = "$want" ]; then
    return 0
  fi
  echo ">> building ${outs[*]} (hack/tools/$name)${slow_note:-}" >&2
  local start=$SECONDS
  local out="$bin/"
  [ "${#outs[@]}" = 1 ] && out="$bin/${outs[0]}"
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out" "${pkgs[@]}")
  echo ">> built ${outs[*]} in $((SECONDS - start))s" >&2
  echo "$want" > "$stamp"
}

want=${1:-all}
case "$want" in
  all|controlplane|controller-gen|crd-ref-docs|helm|golangci-lint|promtool) ;;
  *) echo "usage: $0 [all|controlplane|controller-gen|crd-ref-docs|helm|golangci-lint|promtool]" >&2; exit 2 ;;
esac

if [ "$want" = all ] || [ "$want" = controller-gen ]; then
  build controller-gen "-s -w" controller-gen -- sigs.k8s.io/controller-tools/cmd/controller-gen
fi
if [ "$want" = all ] || [ "$want" = crd-ref-docs ]; then
  # the API reference, docs/reference/api/ (make docs)
  build crd-ref-docs "-s -w" crd-ref-docs -- github.com/elastic/crd-ref-docs
fi
if [ "$want" = all ] || [ "$want" = helm ]; then
  build helm "-s -w -X helm.sh/helm/v4/internal/version.version=v4.3.2" helm -- helm.sh/helm/v4/cmd/helm
fi
if [ "$want" = all ] || [ "$want" = golangci-lint ]; then
  # main.date must be set too, or golangci-lint reports the build info's
  # "(devel)" instead of main.version; the date is the release's (module proxy).
  build golangci-lint "-s -w -X main.version=2.15.0 -X main.date=2026-10-16T10:51:54Z" golangci-lint -- github.com/golangci/golangci-lint/v2/cmd/golangci-lint
fi
if [ "$want" = all ] || [ "$want" = promtool ]; then
  # checks and unit-tests the alerting rules (make test-rules)
  build promtool "-s -w -X github.com/prometheus/common/version.Version=0.316.0" promtool -- github.com/prometheus/prometheus/cmd/promtool
fi
if [ "$want" = all ] || [ "$want" = controlplane ]; then
  build etcd "-s -w" etcd -- go.etcd.io/etcd/server/v3
  build kwok "-s -w" kwok -- sigs.k8s.io/kwok/cmd/kwok
  slow_note="; from a cold cache this takes ~10-15 minutes on 2 cores" build k8s "$k8s_ldflags" kube-apiserver kube-controller-manager kube-scheduler kubectl -- \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
fi
