-- SAFETY.md rule 13, one clock: every timestamp that STEP 1, 5 and 7 and due
-- selection compare is read from the database through oc_clock() (the
-- functions' own clocks are never compared with the ledger's).
CREATE OR REPLACE FUNCTION oc_clock() RETURNS timestamptz
LANGUAGE sql VOLATILE AS $$ SELECT clock_timestamp() $$;

ALTER TABLE ledger_activity ALTER COLUMN at SET DEFAULT oc_clock();

-- SAFETY.md rule 9: an edit of a backend's own row (regions, account, settings,
-- mode, provider) is activity for that backend: its next scheduled run lists.
CREATE OR REPLACE FUNCTION orphan_cleanup_backend_activity() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW IS NOT DISTINCT FROM OLD THEN
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO ledger_activity (backend_id, kind) VALUES (OLD.id, 'backend_' || lower(TG_OP));
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.id IS DISTINCT FROM OLD.id) THEN
        INSERT INTO ledger_activity (backend_id, kind) VALUES (NEW.id, 'backend_' || lower(TG_OP));
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS backends_activity ON backends;
CREATE TRIGGER backends_activity AFTER INSERT OR UPDATE OR DELETE ON backends
    FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_backend_activity();
