-- STEP 1 (SAFETY.md rule 9): a change to an owner whose backend_id names no backends
-- row (a platform writing 'aws') may concern any backend: it is logged with a NULL
-- backend, like a new ref, so STEP 1's query stays a few indexed lookups.
CREATE OR REPLACE FUNCTION orphan_cleanup_activity_backend(b text) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT CASE WHEN EXISTS (SELECT 1 FROM backends WHERE id = b) THEN b END $$;

CREATE OR REPLACE FUNCTION orphan_cleanup_instance_activity() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO ledger_activity (backend_id, kind)
        VALUES (orphan_cleanup_activity_backend(OLD.backend_id), 'instance_' || lower(TG_OP));
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.backend_id IS DISTINCT FROM OLD.backend_id) THEN
        INSERT INTO ledger_activity (backend_id, kind)
        VALUES (orphan_cleanup_activity_backend(NEW.backend_id), 'instance_' || lower(TG_OP));
    END IF;
    RETURN NULL;
END $$;
