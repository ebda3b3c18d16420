#!/usr/bin/env bash
# The demo: installs what it needs, builds, then tells the story in
# tools/src/bin/demo.rs on a node made of network namespaces and a temp dir
# (no cluster needed). Run as root on Debian.
#
# The story is a Rust binary rather than this script because it reuses the
# conformance harness (nodes, pods, the libcni driver, the fake Kubernetes
# API server) and testkit's Drop guards: built with the `tools` profile,
# which unwinds on panic, it removes whatever it made also on Ctrl-C,
# SIGTERM or a failed step, then checks that nothing is left.
set -euo pipefail
cd "$(dirname "$0")"

bash scripts/setup.sh demo
exec bash scripts/tool.sh demo "$@"
