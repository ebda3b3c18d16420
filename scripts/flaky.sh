#!/usr/bin/env bash
# Runs the workspace's tests N times to find the ones that fail only now and
# then, and prints how often each test failed.
#
#   scripts/flaky.sh [--load] [-p PACKAGE]... N [-- TEST-ARGS...]
#
# The test binaries are built once (`cargo test --no-run`), then run N times
# the way `cargo test` runs them: one after the other, each from its
# package's directory, its tests on parallel threads. `--load` keeps every
# core busy with one more process per core for the whole loop, as a loaded
# CI machine would. TEST-ARGS go to every test binary (a test name filter,
# `--test-threads=1`...). Logs of the failed runs are kept in target/flaky/.
# Exit status 0 only when every run of every test passed.
# Run as root on Debian, like ./test.sh (the tests create network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: $0 [--load] [-p PACKAGE]... N [-- TEST-ARGS...]" >&2
  exit 2
}

load=false
packages=()
runs=
while (($#)); do
  case "$1" in
    --load) load=true ;;
    -p) (($# >= 2)) || usage; packages+=(-p "$2"); shift ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) [[ -z "$runs" && "$1" =~ ^[1-9][0-9]*$ ]] || usage; runs=$1 ;;
  esac
  shift
done
[[ -n "$runs" ]] || usage
test_args=("$@")
((${#packages[@]})) || packages=(--workspace)
# Bounds a hung binary (it then counts as failed); generous, the whole suite
# takes a minute or two.
per_binary_timeout=${FLAKY_TIMEOUT:-900}

logs=target/flaky
rm -rf "$logs"
mkdir -p "$logs"

# Cargo names each test executable and its package; no guessing of paths.
# Only the targets built as tests (profile "test":true); there are no
# doctests to loop.
cargo test "${packages[@]}" --locked --no-run --message-format=json-render-diagnostics >"$logs/build.json"
re_exe='"executable":"([^"]+)"'
re_dir='"manifest_path":"([^"]+)/Cargo.toml"'
re_name='"crate_types":\[[^]]*\],"name":"([^"]+)"'
binaries=()
while IFS= read -r line; do
  [[ "$line" == *'"reason":"compiler-artifact"'* && "$line" == *'"test":true},"features"'* ]] || continue
  [[ "$line" =~ $re_exe ]] || continue
  exe=${BASH_REMATCH[1]}
  [[ "$line" =~ $re_dir ]] || continue
  dir=${BASH_REMATCH[1]}
  [[ "$line" =~ $re_name ]] || continue
  binaries+=("$dir|$exe|${dir##*/}/${BASH_REMATCH[1]}")
done <"$logs/build.json"
((${#binaries[@]})) || { echo "flaky: cargo built no test binary" >&2; exit 1; }
cargo=$(command -v cargo)

loaders=()
stop_load() {
  ((${#loaders[@]})) && kill "${loaders[@]}" 2>/dev/null
  loaders=()
}
trap stop_load EXIT
if $load; then
  for _ in $(seq "$(nproc)"); do
    yes >/dev/null &
    loaders+=($!)
  done
  echo "flaky: load: ${#loaders[@]} busy processes (one per core)"
fi

declare -A failed=()
failed_runs=0
for run in $(seq "$runs"); do
  start=$SECONDS
  run_failures=0
  for b in "${binaries[@]}"; do
    IFS='|' read -r dir exe name <<<"$b"
    log="$logs/run$run-${name//\//-}.log"
    # The environment cargo test gives a test process that these tests use.
    set +e
    (cd "$dir" && CARGO="$cargo" CARGO_MANIFEST_DIR="$dir" \
      timeout --kill-after=30 "$per_binary_timeout" "$exe" "${test_args[@]}") >"$log" 2>&1
    rc=$?
    set -e
    if ((rc == 0)); then
      rm -f "$log"
      continue
    fi
    tests=$(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$log")
    if [[ -z "$tests" ]]; then
      # Crashed, hung or failed outside any test.
      tests="(the binary: exit $rc$( ((rc == 124 || rc == 137)) && echo ", timed out"))"
    fi
    while IFS= read -r t; do
      key="$name $t"
      failed[$key]=$((${failed[$key]:-0} + 1))
      run_failures=$((run_failures + 1))
      echo "flaky: run $run: FAILED $key (log: $log)"
    done <<<"$tests"
  done
  ((run_failures)) && failed_runs=$((failed_runs + 1))
  echo "flaky: run $run/$runs: $run_failures failed tests ($((SECONDS - start)) s)"
done
stop_load

echo
echo "flaky: $runs runs of ${#binaries[@]} test binaries$($load && echo ", cores loaded"); $failed_runs runs with failures"
if ((${#failed[@]} == 0)); then
  echo "flaky: no test failed"
  exit 0
fi
echo "failures/runs  binary test"
for key in "${!failed[@]}"; do
  printf '%5d/%-7d %s\n' "${failed[$key]}" "$runs" "$key"
done | sort -rn
exit 1
