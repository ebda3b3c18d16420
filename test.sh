#!/usr/bin/env bash
# The test command: set-up, formatting, lints, then every test in the
# workspace (unit, binary, real netns/iptables, conformance through libcni),
# then the image and manifest lints.
# Run as root on Debian: the tests create network namespaces.
set -euo pipefail
cd "$(dirname "$0")"

bash scripts/setup.sh test
# setup.sh and tool.sh themselves, against fakes (a second or two).
bash scripts/check-scripts.sh

cargo fmt --all --check
# The conformance tests' libcni driver is Go; they build it themselves.
if [[ -n "$(gofmt -l conformance/cnidriver)" ]]; then
  gofmt -d conformance/cnidriver
  exit 1
fi
cargo clippy --workspace --all-targets --locked -- -D warnings
# No async stack in the plugin; one, without ureq, in the agent.
bash scripts/check-stacks.sh
# The binaries under test first: the conformance tests run the plugin and
# the installer from <target dir>/<host triple>/debug/ and never build them.
cargo build --workspace --bins --locked
cargo test --workspace --locked

# Image and manifests: hadolint, kubernetes-validate (strict: unknown fields
# are errors) and cel-python for the admission policy's expressions,
# installed by scripts/setup.sh, offline. The manifests are checked against
# the oldest and the newest Kubernetes the tool knows.
lint=target/lint-venv/bin
"$lint/hadolint" Dockerfile
echo "hadolint: Dockerfile ok"
for k8s in 1.25.0 1.37.0; do
  "$lint/kubernetes-validate" --strict --quiet -k "$k8s" deploy/linkerd-cni.yaml
  echo "kubernetes-validate: deploy/linkerd-cni.yaml ok for Kubernetes $k8s"
done
# The alerting rules: promtool's check and their unit tests (promtool is in
# the venv's bin/, see scripts/setup.sh), then the metrics they read
# against the programs' sources.
"$lint/promtool" check rules deploy/prometheus/linkerd-cni-alerts.yaml
"$lint/promtool" test rules deploy/prometheus/linkerd-cni-alerts.test.yaml
bash scripts/check-alert-metrics.sh
# ValidatingAdmissionPolicy is GA (v1) from Kubernetes 1.30: its file is
# checked against the first version that has it and the newest.
for k8s in 1.30.0 1.37.0; do
  "$lint/kubernetes-validate" --strict --quiet -k "$k8s" deploy/linkerd-cni-admission.yaml
  echo "kubernetes-validate: deploy/linkerd-cni-admission.yaml ok for Kubernetes $k8s"
done
# Its CEL, evaluated on the requests it must allow and deny, then with
# each of its validations removed in turn: each must let a request through.
"$lint/python" scripts/check-admission-policy.py --mutations deploy/linkerd-cni-admission.yaml
