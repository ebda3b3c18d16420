#!/usr/bin/env bash
# Builds and runs one of the tools (tools/src/bin/<name>.rs: demo, bench,
# cri_bench) on
# the release binaries, as root:
#
#   bash scripts/tool.sh bench [--quick]
#
# The plugin and the installer are built as they ship (`release`); the tool
# with the `tools` profile, which unwinds on panic so that its Drop guards
# remove what it made. .cargo/config.toml builds for the host's triple, in
# target/<triple>/. `exec` makes the tool the process a signal reaches.
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:?usage: scripts/tool.sh demo|bench|cri_bench [args...]}
shift
echo "$name: building (release)..." >&2
cargo build --release --locked --quiet -p linkerd-cni -p linkerd-cni-installer
cargo build --profile tools --locked --quiet -p linkerd-cni-tools --bin "$name"
target_dir="$PWD/target/$(rustc --print host-tuple)"
LINKERD_CNI_BIN_DIR="$target_dir/release" exec "$target_dir/tools/$name" "$@"
