"""Pure builders: (job, plan) -> Kubernetes manifests. No API calls here."""
