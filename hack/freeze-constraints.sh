#!/usr/bin/env bash
# Rewrite constraints.txt from the project venv (hack/venv.sh): the exact versions the tests ran with,
# which the operator and trainer images install too. Run after changing pyproject.toml's dependencies.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=$(MEMFIT_CONSTRAINTS=none "$ROOT/hack/venv.sh")
{
  head -3 "$ROOT/constraints.txt"
  "$VENV/bin/python" -m pip freeze --exclude-editable | grep -v -E '^(#|-e )|@ file|^memfit=='
} > "$ROOT/constraints.txt.new"
mv "$ROOT/constraints.txt.new" "$ROOT/constraints.txt"
