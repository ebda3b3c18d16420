#!/usr/bin/env bash
# The test command: set-up, formatting, lints, then every test in the
# workspace (unit, binary, real netns/iptables, conformance through libcni).
# Run as root on Debian: the tests create network namespaces.
set -euo pipefail
cd "$(dirname "$0")"

bash scripts/setup.sh

cargo fmt --all --check
# The conformance tests' libcni driver is Go; they build it themselves.
if [[ -n "$(gofmt -l conformance/cnidriver)" ]]; then
  gofmt -d conformance/cnidriver
  exit 1
fi
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
