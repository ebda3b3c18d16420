#!/usr/bin/env bash
# Checks of the scripts themselves, run by test.sh; needs no root, no
# network and no apt: setup.sh runs against fake apt-get, dpkg-query, cargo
# and rustc on a PATH of their own, and tool.sh only prints where it would
# run the binaries from.
#
#   bash scripts/check-scripts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "check-scripts: FAILED: $*" >&2
  failures=$((failures + 1))
}
# expect NAME WANT_RC: the last run's exit status.
expect_rc() {
  [[ "$rc" == "$2" ]] || fail "$1: exit $rc, expected $2; stderr: $(cat "$tmp/err")"
}
expect_err() {
  grep -qF -- "$2" "$tmp/err" || fail "$1: no \"$2\" in stderr: $(cat "$tmp/err")"
}

# tool.sh runs the binaries from cargo's target dir, wherever that is.
triple=$(rustc --print host-tuple)
for case in "unset|$repo/target" "/tmp/linkerd-cni-x|/tmp/linkerd-cni-x" "rel-t|$repo/rel-t"; do
  dir=${case%%|*} want=${case#*|}
  if [[ "$dir" == unset ]]; then
    got=$(env -u CARGO_TARGET_DIR bash scripts/tool.sh --print-bin-dir)
  else
    # From elsewhere: a relative dir is the repo's, where cargo runs.
    got=$(cd /tmp && CARGO_TARGET_DIR=$dir bash "$repo/scripts/tool.sh" --print-bin-dir)
  fi
  expected="$want/$triple/release"$'\n'"$want/$triple/tools"
  [[ "$got" == "$expected" ]] || fail "tool.sh --print-bin-dir with CARGO_TARGET_DIR=$dir: got \"$got\", expected \"$expected\""
done

# A PATH with only the fakes and the few tools setup.sh uses: no real
# cargo, rustup or apt-get is reachable.
bin=$tmp/bin
mkdir -p "$bin"
for t in dirname sed head mktemp grep cat rm sleep; do
  ln -s "$(command -v "$t")" "$bin/$t"
done
# fake_rust VERSION: cargo and rustc that say VERSION; `cargo fmt` and
# `cargo clippy` are missing.
fake_rust() {
  for t in cargo rustc; do
    printf '#!/bin/sh\n[ "$1" = --version ] && echo "%s %s (fake 2099-01-01)" && exit 0\nexit 1\n' "$t" "$1" >"$bin/$t"
    chmod +x "$bin/$t"
  done
}
# fake_apt LOCKED_CALLS [SUBCOMMAND]: every package missing; apt-get
# answers the first LOCKED_CALLS calls of SUBCOMMAND (update, install;
# default update) as it does when another process holds the lock, then
# succeeds (-1: never), and logs its arguments. APT_FAIL: an install's error.
fake_apt() {
  printf '#!/bin/sh\nexit 1\n' >"$bin/dpkg-query"
  cat >"$bin/apt-get" <<EOF
#!/bin/bash
echo "\$*" >>"$tmp/apt.log"
n=\$(cat "$tmp/apt.count" 2>/dev/null || echo 0)
if [[ " \$* " == *" ${2:-update} "* ]] && (($1 < 0 || n < $1)); then
  echo \$((n + 1)) >"$tmp/apt.count"
  if [[ " \$* " == *" update "* ]]; then
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)" >&2
    echo "E: Unable to lock directory /var/lib/apt/lists/" >&2
  else
    echo "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?" >&2
  fi
  exit 100
fi
[[ -z "\${APT_FAIL:-}" || "\$*" != *" install "* ]] || { echo "E: \$APT_FAIL" >&2; exit 100; }
EOF
  chmod +x "$bin/apt-get" "$bin/dpkg-query"
  rm -f "$tmp/apt.log" "$tmp/apt.count"
}
setup() {
  rc=0
  # No pause between tries unless a case asks for one.
  env -i PATH="$bin" HOME="$tmp" LINKERD_CNI_SETUP_LOCK_POLL=0 "$@" \
    "$(command -v bash)" scripts/setup.sh "$mode" >/dev/null 2>"$tmp/err" || rc=$?
}

# The toolchain: missing or older than Cargo.toml's rust-version, a clear
# stop before anything is installed.
mode=demo
fake_apt 0
rm -f "$bin/cargo" "$bin/rustc"
setup
expect_rc "no cargo" 1
expect_err "no cargo" "no cargo on PATH"
expect_err "no cargo" "https://rustup.rs"
for v in 1.63.0 1.90.9; do
  fake_rust "$v"
  setup
  expect_rc "rust $v" 1
  expect_err "rust $v" "is too old: this workspace needs Rust >= "
  expect_err "rust $v" "rustup toolchain install stable"
done
[[ ! -e "$tmp/apt.log" ]] || fail "apt-get ran without a usable toolchain: $(cat "$tmp/apt.log")"

# The demo's packages only, after waiting for a lock held for two tries.
fake_rust 1.91.0
fake_apt 2
setup
expect_rc "demo, lock held twice" 0
expect_err "demo, lock held twice" "waiting for apt's lock /var/lib/apt/lists/lock, held by process 4242 (apt-get)"
[[ $(grep -c '^-o DPkg::Lock::Timeout=0 update' "$tmp/apt.log") == 3 ]] ||
  fail "demo: apt-get update not tried three times: $(cat "$tmp/apt.log")"
install=$(grep -E '(^| )install ' "$tmp/apt.log" || true)
for p in iptables iproute2 containernetworking-plugins golang-go golang-github-appc-cni-dev; do
  [[ " $install " == *" $p "* ]] || fail "demo: $p not installed: $install"
done
for p in containerd runc gcc nftables; do
  [[ " $install " != *" $p "* ]] || fail "demo: $p installed, which only the tests use: $install"
done

# The dpkg lock, held for an install's first try.
fake_apt 1 install
setup
expect_rc "demo, dpkg lock held once" 0
expect_err "demo, dpkg lock held once" "waiting for apt's lock /var/lib/dpkg/lock-frontend, held by another apt-get or dpkg"
[[ $(grep -c ' install ' "$tmp/apt.log") == 2 ]] ||
  fail "demo: apt-get install not tried twice: $(cat "$tmp/apt.log")"

# A lock never released: given up on, saying so.
fake_apt -1
setup LINKERD_CNI_SETUP_LOCK_WAIT=1 LINKERD_CNI_SETUP_LOCK_POLL=1
expect_rc "lock held for good" 1
expect_err "lock held for good" "apt's lock is still held after"

# Any other failure: at once.
fake_apt 0
setup APT_FAIL="Unable to locate package golang-go"
expect_rc "apt-get failing" 100
expect_err "apt-get failing" "Unable to locate package golang-go"
[[ $(wc -l <"$tmp/apt.log") == 2 ]] || fail "apt-get failing: retried ($(wc -l <"$tmp/apt.log") calls)"

# A lock this user may not take (not root): no wait.
fake_apt 0
setup LINKERD_CNI_SETUP_LOCK_WAIT=2 APT_FAIL="Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?"
expect_rc "apt-get not as root" 100
expect_err "apt-get not as root" "are you root?"
[[ $(wc -l <"$tmp/apt.log") == 2 ]] || fail "apt-get not as root: retried ($(wc -l <"$tmp/apt.log") calls)"

# The tests': the demo's and theirs; then cargo fmt, missing here, with no
# rustup to add it.
mode=test
fake_apt 0
fake_rust 2.0.0
setup
expect_rc "test mode" 1
expect_err "test mode" "\`cargo fmt\` is missing and there is no rustup to add it"
install=$(grep -E '(^| )install ' "$tmp/apt.log" || true)
for p in iptables golang-github-appc-cni-dev nftables containerd runc gcc libc6-dev; do
  [[ " $install " == *" $p "* ]] || fail "test: $p not installed: $install"
done

if ((failures)); then
  echo "check-scripts: $failures failed" >&2
  exit 1
fi
echo "check-scripts: tool.sh and setup.sh ok"
