#!/usr/bin/env bash
# Instructions per idle installer pass (see BENCHMARKS.md): a node in a temp
# dir set up by a first run of the installer, then the installer under
# callgrind with a 0.2 s resync and the watch off, collecting only inside
# Installer::reconcile; prints instructions / calls.
#   bash scripts/idle-pass-cost.sh DIR_WITH_BINARIES [inline|owned]
# DIR_WITH_BINARIES holds linkerd-cni-agent (the installer; built with symbols, e.g.
# the tools profile) and linkerd-cni (the image's plugin binary). No API
# server runs here: the kubeconfig keeps the installer's own token
# (LINKERD_CNI_PLUGIN_TOKEN=own; a kept minted token costs a pass the same
# comparison). EXTRA: more VAR=value settings, e.g.
# EXTRA=LINKERD_CNI_METRICS_ADDR=127.0.0.1:0.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
BIN=$1
MODE=${2:-inline}
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
mkdir -p "$R/host/etc/cni/net.d" "$R/host/opt/cni/bin" "$R/image" "$R/sa/t1"
cp "$BIN/linkerd-cni" "$R/image/linkerd-cni"
echo tok > "$R/sa/t1/token"; echo CA > "$R/sa/t1/ca.crt"; echo ns > "$R/sa/t1/namespace"
ln -s t1 "$R/sa/..data"
for f in token ca.crt namespace; do ln -s "..data/$f" "$R/sa/$f"; done
echo '{"name":"k8s-pod-network","cniVersion":"0.3.1","plugins":[{"type":"calico","mtu":1440,"ipam":{"type":"calico-ipam"}},{"type":"portmap","snat":true,"capabilities":{"portMappings":true}}]}' \
  > "$R/host/etc/cni/net.d/10-calico.conflist"
TPL=$(python3 - "$repo/deploy/linkerd-cni.yaml" "$MODE" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
lines = t[t.index('cni_network_config: |-'):].split('\n')[1:]
out = []
for l in lines:
    if l.startswith('    ') or l == '':
        out.append(l)
    else:
        break
v = json.loads('\n'.join(out))
if sys.argv[2] == 'owned':
    v['chain_mode'] = 'owned'
print(json.dumps(v))
PY
)
run() {
  env -i CONTAINER_MOUNT_PREFIX="$R/host" CONTAINER_CNI_BIN_DIR="$R/image" \
    LINKERD_CNI_SERVICE_ACCOUNT_DIR="$R/sa" DEST_CNI_NET_DIR=/etc/cni/net.d \
    DEST_CNI_BIN_DIR=/opt/cni/bin KUBERNETES_SERVICE_HOST=127.0.0.1 \
    KUBERNETES_SERVICE_PORT=443 CNI_NETWORK_CONFIG="$TPL" \
    LINKERD_CNI_RESYNC_SECONDS=0.2 LINKERD_CNI_WATCH=false PATH=/usr/bin:/bin \
    LINKERD_CNI_PLUGIN_TOKEN="${PLUGIN_TOKEN:-own}" ${EXTRA:-} \
    "$@" >/dev/null 2>>"$R/log" &
  echo $!
}
stop() { kill -TERM "$1"; while kill -0 "$1" 2>/dev/null; do sleep 0.2; done; }
pid=$(run "$BIN/linkerd-cni-agent"); sleep 2; stop "$pid"
pid=$(run valgrind --tool=callgrind --callgrind-out-file="$R/cg.out" \
  '--toggle-collect=*Installer::reconcile' "$BIN/linkerd-cni-agent")
sleep "${SECS:-12}"; stop "$pid"
python3 - "$R/cg.out" <<'PY'
import re, sys
ids, total, calls, cur = {}, 0, 0, None
for l in open(sys.argv[1]):
    l = l.rstrip('\n')
    m = re.match(r'(c?fn)=\((\d+)\)(?: (.*))?$', l)
    if m:
        if m.group(3):
            ids[m.group(2)] = m.group(3)
        if m.group(1) == 'cfn':
            cur = ids.get(m.group(2))
        continue
    if l.startswith('calls=') and cur and cur.endswith('Installer::reconcile'):
        calls += int(l.split()[0][6:])
    if l.startswith('summary:') or l.startswith('totals:'):
        total = int(l.split()[1])
print(f"instructions {total}, passes {calls}, per pass {total // max(calls, 1)}")
PY
