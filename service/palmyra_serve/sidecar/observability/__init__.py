"""What the sidecar tells operators: Prometheus metrics and the JSON access log."""
