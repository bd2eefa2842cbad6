#!/usr/bin/env bash
# Runs every fuzz target of the module for FUZZTIME each (default 10s):
# make test-fuzz. Targets are found with go test -list, so a new one is
# fuzzed without being named here; -short keeps packages whose tests need
# the local cluster from starting it (fuzz targets are pure).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-10s}"
failed=0
for pkg in $(go list ./...); do
	targets=$(go test -short -run '^$' -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
	for t in $targets; do
		echo "== $pkg $t ($fuzztime)"
		if ! go test -short -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" "$pkg"; then
			failed=1
		fi
	done
done
exit "$failed"
