#!/usr/bin/env bash
# The demo: installs what it needs, builds, then tells the story in
# tools/src/bin/demo.rs on a node made of network namespaces and a temp dir
# (no cluster needed). Run as root on Debian.
#
# The story is a Rust binary rather than this script because it reuses the
# conformance harness (nodes, pods, the libcni driver, the fake Kubernetes
# API server) and its Drop guards: built with the `tools` profile, which
# unwinds on panic, it removes whatever it made also on Ctrl-C, SIGTERM or a
# failed step, then checks that nothing is left. `exec` makes it the process
# a signal to this script reaches.
set -euo pipefail
cd "$(dirname "$0")"

bash scripts/setup.sh
echo "demo: building (release)..." >&2
# The plugin and installer as they ship (release), the story with `tools`.
# .cargo/config.toml builds for the host's triple, in target/<triple>/.
cargo build --release --locked --quiet -p linkerd-cni -p linkerd-cni-installer
cargo build --profile tools --locked --quiet -p linkerd-cni-tools --bin demo
target_dir="target/$(rustc --print host-tuple)"
LINKERD_CNI_BIN_DIR="$target_dir/release" exec "$target_dir/tools/demo" "$@"
