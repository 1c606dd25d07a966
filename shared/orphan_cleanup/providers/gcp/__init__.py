"""The GCP adapter of the provider port (Compute Engine)."""
