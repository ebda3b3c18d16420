#!/usr/bin/env bash
# Checks that every linkerd_cni_* metric the alerting rules read is one the
# programs export, by its name in their sources: the installer's
# (agent/src/metrics.rs, names written out whole) and the repair
# controller's (agent/src/repair/metrics.rs, registered without the
# prefix); prometheus-client adds `_total` to a counter's name. promtool's own tests cannot see a
# renamed metric: their input series are made up.
#
#   bash scripts/check-alert-metrics.sh [RULES_FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
rules=${1:-deploy/prometheus/linkerd-cni-alerts.yaml}

names=$(grep -v '^ *#' "$rules" | grep -o 'linkerd_cni_[a-z_]*' | sort -u)
[[ -n "$names" ]] || { echo "check-alert-metrics: no linkerd_cni_* metric in $rules" >&2; exit 1; }
unknown=()
for n in $names; do
  case "$n" in
    linkerd_cni_repair_controller_*)
      short=${n#linkerd_cni_repair_controller_}
      grep -q "\"${short%_total}\"" agent/src/repair/metrics.rs || unknown+=("$n")
      ;;
    *)
      grep -q "\"${n%_total}\"" agent/src/metrics.rs || unknown+=("$n")
      ;;
  esac
done
if ((${#unknown[@]})); then
  echo "check-alert-metrics: $rules reads metrics no program exports: ${unknown[*]} (renamed? see agent/src/metrics.rs and agent/src/repair/metrics.rs)" >&2
  exit 1
fi
echo "check-alert-metrics: the $(wc -w <<<"$names") linkerd_cni_* metrics of $rules are exported"
