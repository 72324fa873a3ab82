#!/bin/sh
# Install the memfit operator (memfit[operator]: kopf, kubernetes client, prometheus-client; no torch)
# into a virtual environment. The operator image (Dockerfile) runs exactly this; tests/e2e/test_images.py
# runs it too, on a copy of the Dockerfile's build context, because CI has no Docker engine.
# Usage: hack/image/install-operator.sh PREFIX [SOURCE_DIR]
set -eu
PREFIX=$1
SRC=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-python3}

"$PYTHON" -m venv "$PREFIX"
# The same exact versions as the test venv (constraints.txt, one file for the venv and both images).
CONSTRAINTS=""
if [ -f "$SRC/constraints.txt" ]; then CONSTRAINTS="-c $SRC/constraints.txt"; fi
# shellcheck disable=SC2086
"$PREFIX/bin/python" -m pip install --disable-pip-version-check --no-warn-script-location $CONSTRAINTS "$SRC[operator]"
# Compile bytecode now: at run time the root filesystem is read-only (PYTHONDONTWRITEBYTECODE=1).
"$PREFIX/bin/python" -m compileall -q "$PREFIX/lib"
if "$PREFIX/bin/python" -c "import torch" 2>/dev/null; then
  echo "install-operator: torch must not be in the operator image" >&2
  exit 1
fi
"$PREFIX/bin/memfit" operator --help >/dev/null
echo "installed memfit $("$PREFIX/bin/python" -c 'import memfit; print(memfit.__version__)') into $PREFIX"
