"""Wiring per runtime: ``bootstrap`` (the one composition root: settings, database,
adapters and queues into a ``Pipeline``), ``aws`` (Lambda: SQS, Powertools, Sentry) and
``gcp`` (Cloud Functions: Pub/Sub, CloudEvents, HTTP)."""
