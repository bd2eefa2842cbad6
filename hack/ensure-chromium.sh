#!/usr/bin/env bash
# Makes sure headless Chromium is installed for the browser test of the
# fleet view (make test-browser): Debian's chromium package, installed with
# apt-get when /usr/bin/chromium (or $CHROMIUM) is missing. Needs root (or
# sudo without a password); otherwise it fails with the command to run.
set -euo pipefail
bin=${CHROMIUM:-/usr/bin/chromium}
if [[ -x "$bin" ]]; then
	exit 0
fi
install=(apt-get install -y --no-install-recommends chromium)
if [[ $(id -u) -ne 0 ]]; then
	if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		sudo=(sudo -n)
	else
		echo "chromium is missing at $bin; install it as root: apt-get update && ${install[*]}" >&2
		exit 1
	fi
else
	sudo=()
fi
echo "installing chromium (${install[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" "${install[@]}"
if [[ ! -x "$bin" ]]; then
	echo "chromium still missing at $bin after: ${install[*]}" >&2
	exit 1
fi
