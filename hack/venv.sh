#!/usr/bin/env bash
# Create or reuse the project's virtual environment (outside the repo, so a warm machine is fast)
# and install memfit with its extras at the exact versions of constraints.txt (the images install the
# same ones). Idempotent: reinstalls only when pyproject.toml or constraints.txt changed.
# Prints the venv path.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${MEMFIT_VENV:-$HOME/.cache/memfit/venv-py311}
EXTRAS=${MEMFIT_EXTRAS:-operator,trainer,dev}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
STAMP="$VENV/.memfit-stamp"
CONSTRAINTS=${MEMFIT_CONSTRAINTS:-$ROOT/constraints.txt}   # "none": resolve freely (hack/freeze-constraints.sh)
C_ARGS=()
if [ "$CONSTRAINTS" != none ] && [ -f "$CONSTRAINTS" ]; then C_ARGS=(-c "$CONSTRAINTS"); fi
WANT="$(cat "$ROOT/pyproject.toml" "${C_ARGS[@]:1}" | sha256sum | cut -c1-16) $EXTRAS $ROOT"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet "${C_ARGS[@]}" -e "$ROOT[$EXTRAS]" >&2
  echo "$WANT" > "$STAMP"
fi
echo "$VENV"
