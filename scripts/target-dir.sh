#!/usr/bin/env bash
# Prints the workspace's target directory, absolute, as cargo uses it:
# target/ in the repo by default, else CARGO_TARGET_DIR (relative to the
# repo root, where the scripts run cargo) or a config's build.target-dir.
# Cargo itself is asked, so the scripts and the builds never disagree.
#
#   bash scripts/target-dir.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# --no-deps: no dependency resolution, nothing fetched; a fraction of a
# second.
meta=$(cargo metadata --no-deps --format-version 1) || {
  echo "target-dir: \`cargo metadata\` failed in $PWD (see above)" >&2
  exit 1
}
re='"target_directory":"([^"\\]*)"'
if [[ ! "$meta" =~ $re ]]; then
  echo "target-dir: no plain target_directory in \`cargo metadata\`'s answer (a path with a quote or a backslash is not supported): set CARGO_TARGET_DIR to a plain path" >&2
  exit 1
fi
echo "${BASH_REMATCH[1]}"
