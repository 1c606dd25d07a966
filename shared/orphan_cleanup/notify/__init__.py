"""The notification port and its adapters (empty for now)."""
