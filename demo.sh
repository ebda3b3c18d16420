#!/usr/bin/env bash
# The demo: installs what it needs, builds, then tells the story in
# conformance/src/bin/demo.rs on a node made of network namespaces and a
# temp dir (no cluster needed). Run as root on Debian.
#
# The story is a Rust binary rather than this script because it reuses the
# conformance harness (nodes, pods, the libcni driver, the fake Kubernetes
# API server) and its clean-up: a supervisor process removes whatever the
# story made, also on Ctrl-C, SIGTERM or a failed step. `exec` makes that
# supervisor the process a signal to this script reaches.
set -euo pipefail
cd "$(dirname "$0")"

bash scripts/setup.sh
echo "demo: building (release)..." >&2
cargo build --release --locked --quiet
exec "target/$(rustc --print host-tuple)/release/demo" "$@"
