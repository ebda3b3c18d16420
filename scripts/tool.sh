#!/usr/bin/env bash
# Builds and runs one of the tools (tools/src/bin/<name>.rs: demo, bench,
# cri_bench) on the release binaries, as root:
#
#   bash scripts/tool.sh bench [--quick]
#   bash scripts/tool.sh --print-bin-dir   # where the binaries are run from
#
# The plugin, the installer and the repair controller are built as they
# ship (`release`); the tool with the `tools` profile, which unwinds on
# panic so that its Drop guards remove what it made. .cargo/config.toml
# builds for the host's triple, in <target dir>/<triple>/, the target dir
# being cargo's (CARGO_TARGET_DIR when set). `exec` makes the tool the
# process a signal reaches.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/tool.sh demo|bench|cri_bench [args...] | --print-bin-dir"
name=${1:?$usage}
shift
target_dir="$(bash scripts/target-dir.sh)/$(rustc --print host-tuple)"
if [[ "$name" == --print-bin-dir ]]; then
  # What a run would use, without building: the release binaries' dir and
  # the tools' dir.
  echo "$target_dir/release"
  echo "$target_dir/tools"
  exit 0
fi
[[ "$name" != -* ]] || { echo "$usage" >&2; exit 2; }
echo "$name: building (release)..." >&2
cargo build --release --locked --quiet -p linkerd-cni -p linkerd-cni-agent
cargo build --profile tools --locked --quiet -p linkerd-cni-tools --bin "$name"
LINKERD_CNI_BIN_DIR="$target_dir/release" exec "$target_dir/tools/$name" "$@"
