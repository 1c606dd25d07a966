-- An operator's keep (``orphans keep REF --backend ID``): the ref's groups are protected
-- (reason ``kept_by_operator``) until ``until`` (NULL: until released). Written by the
-- operator's CLI only; every function reads it (the classifier classifies with it, the
-- deleter re-reads it before a delete: a keep written after the plan wins).
CREATE TABLE IF NOT EXISTS orphan_keeps (
    backend_id   text NOT NULL REFERENCES backends (id) ON DELETE CASCADE,
    provider_ref text NOT NULL,
    reason       text NULL,
    kept_at      timestamptz NOT NULL DEFAULT oc_clock(),
    until        timestamptz NULL,
    PRIMARY KEY (backend_id, provider_ref)
);
