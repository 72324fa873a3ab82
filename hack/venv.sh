#!/usr/bin/env bash
# Create or reuse the project's virtual environment (outside the repo, so a warm machine is fast)
# and install memfit with its extras. Idempotent: reinstalls only when pyproject.toml changed.
# Prints the venv path.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${MEMFIT_VENV:-$HOME/.cache/memfit/venv-py311}
EXTRAS=${MEMFIT_EXTRAS:-operator,trainer,dev}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
STAMP="$VENV/.memfit-stamp"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16) $EXTRAS $ROOT"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$EXTRAS]" >&2
  echo "$WANT" > "$STAMP"
fi
echo "$VENV"
