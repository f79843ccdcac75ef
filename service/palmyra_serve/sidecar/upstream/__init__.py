"""Everything that talks to the engine: the relay's connection pool and its failures, the
control-plane client, the engine's capacity, and the cached copy of its metrics page."""
