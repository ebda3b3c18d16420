#!/usr/bin/env bash
# The dependency rule of the workspace, from Cargo.lock: the plugin (a
# process per pod start) links no async stack; the node agent links one
# (tokio, hyper, kube-rs) and not the plugin's blocking HTTP client (ureq).
# Prints what breaks the rule and fails; offline.
set -euo pipefail
cd "$(dirname "$0")/.."

# A package's normal (non-dev, non-build) dependencies: "name version" lines.
deps() {
  cargo tree --locked --offline -p "$1" -e normal --prefix none --format '{p}' |
    awk '{print $1, $2}' | sort -u
}
plugin=$(deps linkerd-cni)
agent=$(deps linkerd-cni-agent)
fail=0
refuse() { # package, its dependencies, crates it must not link
  local pkg=$1 tree=$2
  shift 2
  for crate in "$@"; do
    if awk -v c="$crate" '$1 == c {found = 1} END {exit !found}' <<<"$tree"; then
      echo "check-stacks: $pkg links $crate: $(cargo tree --locked --offline -p "$pkg" -e normal -i "$crate" --depth 1 | tail -n +2 | tr -s ' \n' ' ')" >&2
      fail=1
    fi
  done
}
refuse linkerd-cni "$plugin" tokio hyper kube async-trait futures
refuse linkerd-cni-agent "$agent" ureq
# One version of each crate of the agent's stack.
for crate in tokio hyper kube kube-client; do
  n=$(awk -v c="$crate" '$1 == c' <<<"$agent" | wc -l)
  if ((n > 1)); then
    echo "check-stacks: linkerd-cni-agent links $n versions of $crate" >&2
    fail=1
  fi
done
((fail == 0)) && echo "check-stacks: the plugin links no async stack; the agent one, without ureq"
exit "$fail"
