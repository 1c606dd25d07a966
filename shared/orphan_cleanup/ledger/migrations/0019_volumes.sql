-- C1: volume owners. A ref whose provider_refs.owner_type is 'volume' is owned by a volumes
-- row: the platform's volume (an AWS EBS volume, a GCP persistent disk) and its provisioning
-- data, as instances rows are for VMs (README, "The ledger (contract C1)"). Column names are a
-- contract; every extra column has a default so plain INSERTs of the contract columns work.
CREATE TABLE IF NOT EXISTS volumes (
    id             text PRIMARY KEY,
    name           text,
    provider_ref   text UNIQUE REFERENCES provider_refs (provider_ref),
    -- pending, provisioning, active, deleting, deleted; anything else is skipped.
    status         text NOT NULL DEFAULT 'pending',
    backend_id     text NULL,
    -- the volume's id: AWS vol-..., the GCP disk's numeric id as a decimal string
    primary_id     text NULL,
    region         text NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    provisioned_at timestamptz NULL,
    deleted_at     timestamptz NULL
);

-- STEP 1 (docs/SAFETY.md rule 9): an insert, update or hard delete of a volumes row is activity
-- of the backend(s) it names, logged as the instances trigger logs it (a backend_id naming no
-- backends row: NULL, activity of every backend; migration 0007).
CREATE OR REPLACE FUNCTION orphan_cleanup_volume_activity() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO ledger_activity (backend_id, kind)
        VALUES (orphan_cleanup_activity_backend(OLD.backend_id), 'volume_' || lower(TG_OP));
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.backend_id IS DISTINCT FROM OLD.backend_id) THEN
        INSERT INTO ledger_activity (backend_id, kind)
        VALUES (orphan_cleanup_activity_backend(NEW.backend_id), 'volume_' || lower(TG_OP));
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS volumes_activity ON volumes;
CREATE TRIGGER volumes_activity AFTER INSERT OR UPDATE OR DELETE ON volumes
    FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_volume_activity();

-- TRUNCATE bypasses row triggers: activity of every backend (migration 0001's function).
DROP TRIGGER IF EXISTS volumes_truncate_activity ON volumes;
CREATE TRIGGER volumes_truncate_activity AFTER TRUNCATE ON volumes
    FOR EACH STATEMENT EXECUTE FUNCTION orphan_cleanup_truncate_activity();

-- The product's functions run for the roles grants.sql grants them to, never for PUBLIC
-- (migration 0013): this one too (a trigger function needs no EXECUTE of the writer).
REVOKE EXECUTE ON FUNCTION orphan_cleanup_volume_activity() FROM PUBLIC;
