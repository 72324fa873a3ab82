#!/usr/bin/env bash
# `make test`: every tier this machine supports, without the `extended` tests (docs/testing.md).
#
# Two pytest processes side by side: the computing tiers (unit, then trainer: torch and DeepSpeed on the CPU,
# no cluster), then the real-node tier (its own control plane and kubelet: it starts when the computing tiers
# end, about 20 minutes before the others would), and the cluster tiers (integration, e2e, reliability: one
# local control plane, mostly waiting on it).
# Each has its own --basetemp (pytest's numbered temp folders are not safe across concurrent sessions)
# and its own log; the computing tiers' log is printed when both are done, and the run fails when either
# fails. MEMFIT_TEST_SERIAL=1 runs the same selection as one process, as before.
#
# Usage: hack/run-tests.sh [-m MARKEXPR] [extra pytest args...]   (default -m "not extended")
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-$(hack/venv.sh)/bin/python}"
MARK="not extended"
if [ "${1:-}" = "-m" ]; then MARK="$2"; shift 2; fi
export MEMFIT_REQUIRE_CLUSTER="${MEMFIT_REQUIRE_CLUSTER:-1}"
COMMON=(-q -ra --durations=30 -m "$MARK" "$@")
TMP="${TMPDIR:-/tmp}/memfit-tests-$$"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT

if [ "${MEMFIT_TEST_SERIAL:-0}" = "1" ]; then
  exec "$PY" -m pytest tests "${COMMON[@]}"
fi

start=$(date +%s)
"$PY" -m pytest tests/unit tests/trainer tests/realnode "${COMMON[@]}" --basetemp="$TMP/trainer" -p no:cacheprovider \
  >"$TMP/trainer.log" 2>&1 &
trainer=$!
"$PY" -m pytest tests --ignore=tests/trainer --ignore=tests/unit --ignore=tests/realnode "${COMMON[@]}" \
  --basetemp="$TMP/cluster"
cluster_rc=$?
echo "== cluster tiers (integration, e2e, reliability): exit $cluster_rc after $(( $(date +%s) - start )) s"
wait "$trainer"
trainer_rc=$?
echo "== unit, trainer and realnode tiers (run beside them; their output follows): exit $trainer_rc after $(( $(date +%s) - start )) s"
cat "$TMP/trainer.log"
[ "$cluster_rc" -eq 0 ] && [ "$trainer_rc" -eq 0 ]
