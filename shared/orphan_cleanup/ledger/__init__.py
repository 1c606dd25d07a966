"""The ledger port and its Postgres adapter: every SQL statement of a cycle (``store``,
``session``, ``locked``), the operator's reads (``reports``, ``explain``), the platform's
writer (``client.LedgerClient``), connections (``db``, ``url``, ``embedded``) and the
migrations."""
