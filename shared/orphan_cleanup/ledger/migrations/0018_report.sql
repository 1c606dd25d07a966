-- What ``report`` reads (C3): when each orphan became one (its owner's end, else its
-- creation), when it was deleted, and its size facts as the listing read them (priced
-- with the backend's ``prices`` when the report runs). NULL on rows older than this
-- migration: the report falls back to first_seen and last_seen.
ALTER TABLE orphans ADD COLUMN IF NOT EXISTS orphan_since timestamptz NULL;
ALTER TABLE orphans ADD COLUMN IF NOT EXISTS deleted_at timestamptz NULL;
ALTER TABLE orphans ADD COLUMN IF NOT EXISTS size jsonb NULL;
