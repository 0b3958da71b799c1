"""The serving image's own code: entrypoint, per-request figures, fused parallel-draft kernel and plugin."""
