"""The provider port (``base.ResourceProvider``) and its adapters: AWS (``aws*``) and GCP
(``gcp*``), and the request budgets they share (``ratelimit``)."""
