#!/usr/bin/env bash
# Debian packages the real node needs (docs/realnode.md): containerd and runc (the kubelet's runtime),
# the CNI plugins (bridge, host-local, loopback, portmap), docker.io (dockerd, only to build images from
# the project's Dockerfiles with the legacy builder), debootstrap (the base image: no registry here),
# nftables (kube-proxy --proxy-mode=nftables), iptables, gcc (the static pause binary).
# Idempotent: apt runs only when a package is missing. Starts no daemon (the real node starts its own).
# Usage: hack/install-realnode.sh [--check]   (--check: exit 1 naming what is missing, install nothing)
set -euo pipefail
PKGS="docker.io containerd runc containernetworking-plugins debootstrap nftables iptables gcc libc6-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then exit 0; fi
if [ "${1:-}" = "--check" ]; then echo "missing Debian packages:$missing" >&2; exit 1; fi
if [ "$(id -u)" != 0 ]; then echo "install-realnode: need root for apt-get (missing:$missing)" >&2; exit 1; fi
echo "[install-realnode] apt-get install$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# --no-install-recommends: docker.io would otherwise pull in a full build toolchain and cgroupfs-mount.
apt-get install -y -qq --no-install-recommends $missing >&2
