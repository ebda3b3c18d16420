#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: installs the Debian packages the
# tests and the demo drive (real iptables, the reference CNI plugins, Go and
# libcni's source for the conformance driver) when they are missing.
set -euo pipefail

PACKAGES=(
  iptables                      # iptables-legacy, iptables-nft, *-save/-restore
  iproute2                      # ip netns
  containernetworking-plugins   # reference plugins in /usr/lib/cni
  golang-go                     # builds the libcni driver
  golang-github-appc-cni-dev    # libcni source (GOPATH mode, offline)
  inotify-tools
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$c"
  fi
done
