#!/usr/bin/env bash
# Build the test cluster's binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok, helm) from the Go module proxy at pinned versions, into a cache outside the repo keyed by
# version. Idempotent: does nothing when the binaries are already there.
# Usage: hack/install-testbin.sh [--print-dir]   (prints the bin dir; --print-dir builds nothing)
# Recipe and pins: docs/testcluster.md (derived from shared/reference/testcluster.md).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.36.3}
ETCD_VERSIONS=${ETCD_VERSIONS:-"3.6.8 3.6.13"}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
HELM_VERSION=${HELM_VERSION:-3.22.0}
CACHE=${MEMFIT_TESTBIN_CACHE:-$HOME/.cache/memfit-testbin}
BIN="$CACHE/k8s-v$K8S_VERSION-etcd-kwok-v$KWOK_VERSION-helm-v$HELM_VERSION/bin"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath
JOBS=${GO_BUILD_JOBS:-2}

log() { printf '[install-testbin] %s\n' "$*" >&2; }

build_kubernetes() {
  local minor patch src="$CACHE/src/k8s-v$K8S_VERSION"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2); patch=$(echo "$K8S_VERSION" | cut -d. -f3)
  mkdir -p "$src"; cd "$src"
  [ -f go.mod ] || go mod init example.invalid/memfit-k8s-testbin >/dev/null 2>&1
  sed -i '/^godebug/d' go.mod   # rewritten below; a stale line can make go.mod unloadable
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  # Each staging module is required at v0.0.0 and replaced by ./staging; point them at v0.MINOR.PATCH.
  for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => \./staging/src/.*#\1#p' "$gomod"); do
    go mod edit -replace="$m=$m@v0.$minor.$patch"
  done
  # Carry upstream's godebug defaults (a dependency's godebug line is ignored); 1.36 -> go1.26.
  local godebug
  godebug=$(sed -n 's/^godebug[[:space:]]\{1,\}\([^ ]*\)$/\1/p' "$gomod" | head -1)
  if [ -n "$godebug" ]; then go mod edit -godebug="$godebug"; fi
  go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@v$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-scheduler@v$K8S_VERSION"
  local x="" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x="$x -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  go build -p "$JOBS" -ldflags "-s -w $x" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler
}

build_etcd() {
  local v
  for v in $ETCD_VERSIONS; do
    local src="$CACHE/src/etcd-v$v"
    mkdir -p "$src"; cd "$src"
    [ -f go.mod ] || go mod init example.invalid/memfit-etcd-testbin >/dev/null 2>&1
    if go get -tool "go.etcd.io/etcd/server/v3@v$v" && \
       go build -p "$JOBS" -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$v" -o "$BIN/etcd" go.etcd.io/etcd/server/v3; then
      echo "$v" > "$BIN/etcd.version"; return 0
    fi
    log "etcd v$v failed, trying the next fallback"
  done
  return 1
}

if [ "${1:-}" = "--print-dir" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$BIN"
if [ ! -x "$BIN/etcd" ]; then log "building etcd"; build_etcd; fi
if [ ! -x "$BIN/kwok" ]; then log "building kwok v$KWOK_VERSION"; GOBIN="$BIN" go install "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"; fi
if [ ! -x "$BIN/helm" ]; then log "building helm v$HELM_VERSION"; GOBIN="$BIN" go install "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"; fi
if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-controller-manager" ] || [ ! -x "$BIN/kube-scheduler" ]; then
  log "building kubernetes v$K8S_VERSION (cold: tens of minutes on 2 cores)"; build_kubernetes
fi
echo "$BIN"
