#!/usr/bin/env bash
# Build the test cluster's binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok, helm) from the Go module proxy at pinned versions, into a cache outside the repo keyed by
# version; the real node's (kubelet, kube-proxy, CoreDNS) into a sibling folder; and the Kueue manager
# (with its CRDs and webhook manifests, docs/kueue.md) into another. Idempotent: does nothing when the
# binaries are already there. Go builds run at `nice` (the machine is shared).
# Usage: hack/install-testbin.sh [--print-dir | --print-node-dir | --print-kueue-dir | --no-node | --demo | --demo-node]
#   --print-*-dir print a folder and build nothing; --no-node skips the node binaries; --demo builds only
#   what `make demo` runs (the control plane and KWOK: no Helm, no Kueue, no node binaries); --demo-node
#   adds the real node's binaries to that (`make demo-realnode`).
# Recipe and pins: docs/testcluster.md, docs/realnode.md (from shared/reference/{testcluster,realnode}.md).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.36.3}
ETCD_VERSIONS=${ETCD_VERSIONS:-"3.6.8 3.6.13"}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
HELM_VERSION=${HELM_VERSION:-3.22.0}
CACHE=${MEMFIT_TESTBIN_CACHE:-$HOME/.cache/memfit-testbin}
COREDNS_VERSION=${COREDNS_VERSION:-1.12.4}
KUEUE_VERSION=${KUEUE_VERSION:-0.19.1}
BIN="$CACHE/k8s-v$K8S_VERSION-etcd-kwok-v$KWOK_VERSION-helm-v$HELM_VERSION/bin"
# A separate folder, so adding the node binaries did not invalidate the control plane's cache.
NODE_BIN="$CACHE/node-k8s-v$K8S_VERSION-coredns-v$COREDNS_VERSION/bin"
# Kueue: bin/kueue plus config/{crd,webhook}/ copied from the module (the module cache may be cleaned).
KUEUE_DIR="$CACHE/kueue-v$KUEUE_VERSION"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath
JOBS=${GO_BUILD_JOBS:-2}

log() { printf '[install-testbin] %s\n' "$*" >&2; }

# tools_module SRC: a tools go.mod that replaces each staging module of k8s.io/kubernetes with its
# published v0.MINOR.PATCH and carries upstream's godebug line (docs/testcluster.md).
tools_module() {
  local src=$1 minor patch
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
}

# version_ldflags: the -X flags that stamp `--version` (hack/lib/version.sh upstream).
version_ldflags() {
  local minor x="" p
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x="$x -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$x"
}

build_kubernetes() {
  tools_module "$CACHE/src/k8s-v$K8S_VERSION"
  go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@v$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-scheduler@v$K8S_VERSION"
  go build -p "$JOBS" -ldflags "-s -w $(version_ldflags)" -o "$BIN/" \
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

# The real node (docs/realnode.md): kubelet and kube-proxy from the same k8s.io/kubernetes release,
# in their own tools module (adding tools to the control plane's could move its dependencies).
build_node() {
  tools_module "$CACHE/src/k8s-node-v$K8S_VERSION"
  go get -tool "k8s.io/kubernetes/cmd/kubelet@v$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-proxy@v$K8S_VERSION"
  go build -p "$JOBS" -ldflags "-s -w $(version_ldflags)" -o "$NODE_BIN/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
}

# The Kueue manager (cmd/kueue) in its own tools module: its client-go (v0.35) differs from the
# control plane's; Kueue's go.mod has no replace or godebug lines, so `go get -tool` resolves it as is.
build_kueue() {
  local src="$CACHE/src/kueue-v$KUEUE_VERSION" v=sigs.k8s.io/kueue/pkg/version
  mkdir -p "$src" "$KUEUE_DIR/bin"; cd "$src"
  [ -f go.mod ] || go mod init example.invalid/memfit-kueue >/dev/null 2>&1
  nice -n 10 go get -tool "sigs.k8s.io/kueue/cmd/kueue@v$KUEUE_VERSION"
  nice -n 10 go build -p "$JOBS" -ldflags "-s -w -X $v.GitVersion=v$KUEUE_VERSION -X $v.BuildDate=1970-01-01T00:00:00Z" \
    -o "$KUEUE_DIR/bin/kueue.tmp" sigs.k8s.io/kueue/cmd/kueue
  local mod
  mod=$(go list -m -f '{{.Dir}}' "sigs.k8s.io/kueue")
  rm -rf "$KUEUE_DIR/config"; mkdir -p "$KUEUE_DIR/config/crd" "$KUEUE_DIR/config/webhook"
  cp "$mod"/config/components/crd/bases/*.yaml "$KUEUE_DIR/config/crd/"
  cp "$mod/config/components/webhook/manifests.yaml" "$KUEUE_DIR/config/webhook/"
  chmod -R u+w "$KUEUE_DIR/config"   # module cache files are read-only
  mv "$KUEUE_DIR/bin/kueue.tmp" "$KUEUE_DIR/bin/kueue"   # last: its presence means the folder is complete
}

case "${1:-}" in
  --print-dir) echo "$BIN"; exit 0 ;;
  --print-node-dir) echo "$NODE_BIN"; exit 0 ;;
  --print-kueue-dir) echo "$KUEUE_DIR"; exit 0 ;;
esac
mkdir -p "$BIN"
if [ ! -x "$BIN/etcd" ]; then log "building etcd"; build_etcd; fi
if [ ! -x "$BIN/kwok" ]; then log "building kwok v$KWOK_VERSION"; GOBIN="$BIN" go install "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"; fi
DEMO=""; case "${1:-}" in --demo|--demo-node) DEMO=1 ;; esac
if [ -z "$DEMO" ] && [ ! -x "$BIN/helm" ]; then log "building helm v$HELM_VERSION"; GOBIN="$BIN" go install "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"; fi
if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-controller-manager" ] || [ ! -x "$BIN/kube-scheduler" ]; then
  log "building kubernetes v$K8S_VERSION (cold: tens of minutes on 2 cores)"; build_kubernetes
fi
if [ -z "$DEMO" ] && [ ! -x "$KUEUE_DIR/bin/kueue" ]; then
  log "building kueue v$KUEUE_VERSION (cold: module downloads and a full compile, minutes)"; (build_kueue)
fi
if [ "${1:-}" != "--no-node" ] && [ "${1:-}" != "--demo" ]; then
  mkdir -p "$NODE_BIN"
  if [ ! -x "$NODE_BIN/coredns" ]; then
    log "building coredns v$COREDNS_VERSION"
    # CoreDNS's go.mod has no replace lines: a plain go install works (CGO off: static).
    GOBIN="$NODE_BIN" go install -ldflags "-s -w" "github.com/coredns/coredns@v$COREDNS_VERSION"
  fi
  if [ ! -x "$NODE_BIN/kubelet" ] || [ ! -x "$NODE_BIN/kube-proxy" ]; then
    log "building kubelet and kube-proxy v$K8S_VERSION (cold: about 10 min on 2 cores)"; build_node
  fi
fi
echo "$BIN"
