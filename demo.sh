#!/usr/bin/env bash
# The demo: builds linkerd-cni and shows what it does on this machine.
set -euo pipefail
cd "$(dirname "$0")"

bash scripts/setup.sh
cargo build --release --locked --quiet
bin=target/x86_64-unknown-linux-gnu/release/linkerd-cni

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "VERSION: which CNI versions linkerd-cni speaks"
printf '{"cniVersion":"0.3.1"}' | CNI_COMMAND=VERSION "$bin"

say "ADD as the last plugin of a Calico chain: the primary's result passes through"
CNI_COMMAND=ADD CNI_CONTAINERID=demo CNI_NETNS=/var/run/netns/demo CNI_IFNAME=eth0 \
CNI_ARGS="K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-0" "$bin" <<'JSON'
{"cniVersion":"0.3.1","name":"k8s-pod-network","type":"linkerd-cni","chain_heal":false,
 "prevResult":{"cniVersion":"0.3.1","interfaces":[{"name":"cali0"}],
   "ips":[{"version":"4","address":"10.244.1.17/32"}],"dns":{}}}
JSON

say "A broken config is a CNI error on stdout, with a non-zero exit"
echo '{not json' | CNI_COMMAND=ADD CNI_CONTAINERID=demo CNI_NETNS=/x CNI_IFNAME=eth0 "$bin" || echo "(exit $?)"
