"""From start to stop: engine health, warmup that earns readiness, and drain."""
