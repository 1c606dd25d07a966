-- An operator's keep (``orphans keep REF --backend ID``): the ref's groups are protected
-- (reason ``kept_by_operator``) until ``until`` (NULL: until released), in every backend of
-- the keeping backend's account (``scope``, as ``queries.SCOPE_SQL`` names it, captured when
-- the keep is written: ownership and listing are per account, SAFETY.md rules 10 and 16).
-- Written by the operator's CLI only; every function reads it (the classifier classifies with
-- it, the deleter re-reads it before a delete: a keep written after the plan wins). No foreign
-- key: removing (and re-adding) a backend row never drops a keep silently.
CREATE TABLE IF NOT EXISTS orphan_keeps (
    scope        text NULL,  -- filled from the backend row when the writer gives none
    backend_id   text NOT NULL,
    provider_ref text NOT NULL,
    reason       text NULL,
    kept_at      timestamptz NOT NULL DEFAULT oc_clock(),
    until        timestamptz NULL,
    PRIMARY KEY (backend_id, provider_ref)
);
CREATE INDEX IF NOT EXISTS orphan_keeps_scope_idx ON orphan_keeps (scope, provider_ref);

-- A keep written without its scope (plain SQL) gets its backend's, as queries.SCOPE_SQL says it.
CREATE OR REPLACE FUNCTION orphan_cleanup_keep_scope() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.scope IS NULL THEN
        SELECT b.provider || ':' || CASE WHEN b.provider = 'gcp'
                   THEN coalesce(nullif(b.settings->>'project', ''), b.account) ELSE b.account END
          INTO NEW.scope FROM backends b WHERE b.id = NEW.backend_id;
    END IF;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS orphan_keeps_scope ON orphan_keeps;
CREATE TRIGGER orphan_keeps_scope BEFORE INSERT OR UPDATE ON orphan_keeps
    FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_keep_scope();

-- A keep that ends is STEP 1 activity of its backend (docs/SAFETY.md rule 9): a scheduled
-- cycle lists again and judges the group as it is, instead of waiting for other activity.
-- A release (the row deleted) is activity now; a keep with an end is activity at its end
-- (a row dated then: until that time, STEP 1 sees it as activity after any clean before it).
CREATE OR REPLACE FUNCTION orphan_cleanup_keep_activity() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO ledger_activity (backend_id, kind) VALUES (OLD.backend_id, 'keep_released');
        RETURN OLD;
    END IF;
    IF NEW.until IS NOT NULL THEN
        INSERT INTO ledger_activity (backend_id, at, kind) VALUES (NEW.backend_id, NEW.until, 'keep_ends');
    END IF;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS orphan_keeps_activity ON orphan_keeps;
CREATE TRIGGER orphan_keeps_activity AFTER INSERT OR UPDATE OR DELETE ON orphan_keeps
    FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_keep_activity();
