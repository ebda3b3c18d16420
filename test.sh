#!/usr/bin/env bash
# The test command: set-up, formatting, lints, then every test in the
# workspace (unit, binary, real netns/iptables, conformance through libcni).
# Run as root on Debian: the tests create network namespaces.
set -euo pipefail
cd "$(dirname "$0")"

bash scripts/setup.sh

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
