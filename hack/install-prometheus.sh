#!/usr/bin/env bash
# Unpack Debian's `prometheus` package (prometheus + promtool) into a cache outside the repo and
# print its bin dir. Idempotent: does nothing when the binaries are already there. No service is
# installed or started: the .deb is fetched with `apt-get download` and unpacked with `dpkg -x`.
# Usage: hack/install-prometheus.sh [--print-dir]   (--print-dir prints the bin dir, installs nothing)
# Tests use it via tests/e2e/prom.py; override the location with MEMFIT_PROMETHEUS_DIR.
set -euo pipefail

VERSION=${PROMETHEUS_DEB_VERSION:-2.42.0+ds-5+deb12u1}
CACHE=${MEMFIT_PROMETHEUS_CACHE:-$HOME/.cache/memfit/prometheus}
ROOT="$CACHE/$VERSION"
BIN="$ROOT/usr/bin"

log() { printf '[install-prometheus] %s\n' "$*" >&2; }

if [ "${1:-}" = "--print-dir" ]; then echo "$BIN"; exit 0; fi
if [ -x "$BIN/prometheus" ] && [ -x "$BIN/promtool" ]; then echo "$BIN"; exit 0; fi

command -v apt-get >/dev/null || { log "apt-get not found: install prometheus $VERSION by hand into $BIN"; exit 1; }
tmp=$(mktemp -d); chmod 755 "$tmp"; trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
log "downloading prometheus=$VERSION"
if ! apt-get download "prometheus=$VERSION" >&2; then
  log "download failed; refreshing the package lists once (needs root)"
  apt-get update -qq >&2
  apt-get download "prometheus=$VERSION" >&2
fi
mkdir -p "$ROOT.partial"
dpkg -x prometheus_*.deb "$ROOT.partial"
"$ROOT.partial/usr/bin/promtool" --version >&2
rm -rf "$ROOT"; mv "$ROOT.partial" "$ROOT"
log "unpacked into $ROOT"
echo "$BIN"
