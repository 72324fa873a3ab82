"""A real node next to the KWOK pools: kubelet, containerd, CNI bridge, kube-proxy and CoreDNS (docs/realnode.md)."""
