"""The notification port (``base.Notifier``) and its adapters: SNS, Pub/Sub, a Slack
incoming webhook. Each sends one C6 digest; none is created at import time."""
