"""The AWS adapter of the provider port (EC2)."""
