"""What the sidecar decides about every field of a request body before the engine sees it."""
