"""The queue port (``base.Queue``) and its adapters: SQS, Pub/Sub, in-process."""
