-- C1: the ledger a platform writes. Column names are a contract; every extra
-- column has a default so plain INSERTs of the contract columns work.

CREATE TABLE IF NOT EXISTS backends (
    id          text PRIMARY KEY,
    provider    text NOT NULL CHECK (provider IN ('aws', 'gcp')),
    account     text NOT NULL,
    regions     text[] NOT NULL DEFAULT '{}',
    settings    jsonb NOT NULL DEFAULT '{}'::jsonb,
    mode        text NULL CHECK (mode IS NULL OR mode IN ('report', 'delete', 'off')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS provider_refs (
    provider_ref text PRIMARY KEY CHECK (provider_ref ~ '^[a-z0-9]{12}$'),
    owner_type   text NOT NULL DEFAULT 'instance',
    owner_id     text,
    owner_name   text,
    issued_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS instances (
    id             text PRIMARY KEY,
    name           text,
    provider_ref   text UNIQUE REFERENCES provider_refs (provider_ref),
    -- pending, provisioning, idle, busy, terminating, terminated; anything else is skipped.
    status         text NOT NULL DEFAULT 'pending',
    backend_id     text NULL,
    primary_id     text NULL,
    region         text NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    provisioned_at timestamptz NULL,
    terminated_at  timestamptz NULL,
    deleted_at     timestamptz NULL
);

CREATE INDEX IF NOT EXISTS instances_backend_idx ON instances (backend_id);

-- Activity log for STEP 1 (SAFETY.md rule 9). Written by triggers, so a
-- platform writing plain SQL is covered. backend_id NULL = may concern any backend.
CREATE TABLE IF NOT EXISTS ledger_activity (
    id         bigserial PRIMARY KEY,
    backend_id text NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind       text NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_activity_backend_at_idx ON ledger_activity (backend_id, at);

CREATE OR REPLACE FUNCTION orphan_cleanup_ref_activity() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A ref does not know its backend yet: it may concern any backend.
    INSERT INTO ledger_activity (backend_id, kind) VALUES (NULL, 'ref_' || lower(TG_OP));
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION orphan_cleanup_instance_activity() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO ledger_activity (backend_id, kind) VALUES (OLD.backend_id, 'instance_' || lower(TG_OP));
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.backend_id IS DISTINCT FROM OLD.backend_id) THEN
        INSERT INTO ledger_activity (backend_id, kind) VALUES (NEW.backend_id, 'instance_' || lower(TG_OP));
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS provider_refs_activity ON provider_refs;
CREATE TRIGGER provider_refs_activity AFTER INSERT OR UPDATE OR DELETE ON provider_refs
    FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_ref_activity();

DROP TRIGGER IF EXISTS instances_activity ON instances;
CREATE TRIGGER instances_activity AFTER INSERT OR UPDATE OR DELETE ON instances
    FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_instance_activity();

-- TRUNCATE bypasses row triggers: count it as activity for every backend.
CREATE OR REPLACE FUNCTION orphan_cleanup_truncate_activity() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_activity (backend_id, kind) VALUES (NULL, lower(TG_TABLE_NAME) || '_truncate');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS instances_truncate_activity ON instances;
CREATE TRIGGER instances_truncate_activity AFTER TRUNCATE ON instances
    FOR EACH STATEMENT EXECUTE FUNCTION orphan_cleanup_truncate_activity();
