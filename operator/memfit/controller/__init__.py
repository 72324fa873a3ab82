"""kopf handlers and reconcile: the only place that talks to the API server."""
