-- Coverage never shrinks silently (docs/SAFETY.md rule 24). When a backends row is deleted, or
-- its provider account (a GCP backend's project included) or regions change, what it covered
-- stays listed as a retired coverage: the provider, account, the regions no longer covered and
-- the last settings. A trigger captures it, so the platform's plain SQL is caught as well as
-- `backend remove`. A backend whose mode was 'off' covered nothing: it leaves none.
--
-- A retired coverage runs on the tick like a backend, under its own id ('<backend id>~<n>': no
-- backend id the CLI accepts holds a '~'), report-only unless the backend's last mode said
-- delete (the stack's ceiling applies as to any backend). It retires itself, with an event,
-- after a clean cycle that recorded no group needing a decision and found no group whose owner
-- names the backend it came from (cycles.origin_seen); an operator may drop it
-- (`backend forget-coverage`, an event).
CREATE TABLE IF NOT EXISTS retired_coverages (
    id          text PRIMARY KEY,
    backend_id  text NOT NULL,            -- the backend it came from
    provider    text NOT NULL,
    account     text NOT NULL,
    regions     text[] NOT NULL,
    settings    jsonb NOT NULL,
    last_mode   text NULL,                -- the backend's mode when it was retired
    mode        text NOT NULL CHECK (mode IN ('report', 'delete')),
    why         text NOT NULL CHECK (why IN ('removed', 'moved')),
    retired_at  timestamptz NOT NULL DEFAULT oc_clock()
);
CREATE INDEX IF NOT EXISTS retired_coverages_backend_idx ON retired_coverages (backend_id);
CREATE SEQUENCE IF NOT EXISTS retired_coverages_seq;

-- What the tick runs: every backend, and every retired coverage under its own id, with the
-- backend it came from (retired_from: NULL for a backend) and the backend id owners name for
-- what it covers (origin).
CREATE OR REPLACE VIEW coverages AS
    SELECT id, provider, account, regions, settings, mode, NULL::text AS retired_from, id AS origin
      FROM backends
    UNION ALL
    SELECT id, provider, account, regions, settings, mode, backend_id, backend_id
      FROM retired_coverages;

-- A cycle found a group whose owner names the backend a retired coverage came from (the
-- classifier sets it; it never goes back to false).
ALTER TABLE cycles ADD COLUMN IF NOT EXISTS origin_seen boolean NOT NULL DEFAULT false;

-- The schedule and marks of a retired coverage live under its id, which is no backends row:
-- cleanup and orphan_marks no longer reference backends; the triggers below delete a removed
-- backend's rows (what the cascade did) and a retired coverage's.
DO $$
DECLARE
    fk record;
BEGIN
    FOR fk IN
        SELECT c.conrelid::regclass AS tbl, c.conname
          FROM pg_constraint c
         WHERE c.contype = 'f'
           AND c.confrelid = 'backends'::regclass
           AND c.conrelid IN ('cleanup'::regclass, 'orphan_marks'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fk.tbl, fk.conname);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION orphan_cleanup_retire_coverage() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_scope text := OLD.provider || ':' || CASE WHEN OLD.provider = 'gcp'
        THEN coalesce(nullif(OLD.settings->>'project', ''), OLD.account) ELSE OLD.account END;
    new_scope text;
    gone text[];
    cov text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM cleanup WHERE backend_id = OLD.id;
        DELETE FROM orphan_marks WHERE backend_id = OLD.id;
        gone := OLD.regions;
    ELSE
        new_scope := NEW.provider || ':' || CASE WHEN NEW.provider = 'gcp'
            THEN coalesce(nullif(NEW.settings->>'project', ''), NEW.account) ELSE NEW.account END;
        IF new_scope IS DISTINCT FROM old_scope THEN
            gone := OLD.regions;
        ELSE
            gone := ARRAY(SELECT r FROM unnest(OLD.regions) AS r
                           WHERE NOT r = ANY(coalesce(NEW.regions, '{}')) ORDER BY r);
        END IF;
    END IF;
    IF OLD.mode IS NOT DISTINCT FROM 'off' OR coalesce(cardinality(gone), 0) = 0 THEN
        RETURN NULL;
    END IF;
    LOOP  -- an id no backends row holds (plain SQL may have written one with a '~')
        cov := OLD.id || '~' || nextval('retired_coverages_seq');
        EXIT WHEN NOT EXISTS (SELECT 1 FROM backends WHERE id = cov);
    END LOOP;
    INSERT INTO retired_coverages (id, backend_id, provider, account, regions, settings, last_mode, mode, why)
    VALUES (cov, OLD.id, OLD.provider, OLD.account, gone, OLD.settings, OLD.mode,
            CASE WHEN OLD.mode = 'delete' THEN 'delete' ELSE 'report' END,
            CASE WHEN TG_OP = 'DELETE' THEN 'removed' ELSE 'moved' END);
    INSERT INTO events (backend_id, kind, message, details)
    VALUES (cov, 'coverage_retained',
            format('backend %s %s: %s %s, regions %s, stays listed as %s', OLD.id,
                   CASE WHEN TG_OP = 'DELETE' THEN 'was removed' ELSE 'moved' END,
                   OLD.provider, OLD.account, array_to_string(gone, ','), cov),
            jsonb_build_object('from', OLD.id, 'account', OLD.account, 'regions', to_jsonb(gone),
                               'mode', CASE WHEN OLD.mode = 'delete' THEN 'delete' ELSE 'report' END));
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS backends_retire_coverage ON backends;
CREATE TRIGGER backends_retire_coverage AFTER DELETE OR UPDATE OF provider, account, regions, settings
    ON backends FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_retire_coverage();

-- A backends row may not take a retired coverage's id: the two would share one schedule, one
-- lease and one id in every cycle (the coverages view would hold the id twice).
CREATE OR REPLACE FUNCTION orphan_cleanup_refuse_coverage_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM retired_coverages WHERE id = NEW.id) THEN
        RAISE EXCEPTION 'backend id % is the id of a retired coverage (orphan-cleanup, docs/SAFETY.md rule 24):'
                        ' choose another id', NEW.id;
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS backends_refuse_coverage_id ON backends;
CREATE TRIGGER backends_refuse_coverage_id BEFORE INSERT OR UPDATE OF id ON backends
    FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_refuse_coverage_id();

-- TRUNCATE bypasses row triggers and would drop every coverage at once: refused.
CREATE OR REPLACE FUNCTION orphan_cleanup_refuse_backends_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'TRUNCATE backends would drop what the backends cover unseen (orphan-cleanup, '
                    'docs/SAFETY.md rule 24): DELETE the rows instead';
END $$;
DROP TRIGGER IF EXISTS backends_refuse_truncate ON backends;
CREATE TRIGGER backends_refuse_truncate BEFORE TRUNCATE ON backends
    FOR EACH STATEMENT EXECUTE FUNCTION orphan_cleanup_refuse_backends_truncate();

-- A retired coverage gone (retired by a clean cycle, or forgotten): its schedule and marks go.
CREATE OR REPLACE FUNCTION orphan_cleanup_coverage_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM cleanup WHERE backend_id = OLD.id;
    DELETE FROM orphan_marks WHERE backend_id = OLD.id;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS retired_coverages_gone ON retired_coverages;
CREATE TRIGGER retired_coverages_gone AFTER DELETE ON retired_coverages
    FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_coverage_gone();

-- A clean cycle of a retired coverage that recorded no group needing a decision (orphan,
-- skipped, protected) and found no group whose owner names the backend it came from: nothing
-- of that backend is left there. The coverage retires itself, with an event.
CREATE OR REPLACE FUNCTION orphan_cleanup_coverage_retired() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cov retired_coverages%ROWTYPE;
BEGIN
    SELECT * INTO cov FROM retired_coverages WHERE id = NEW.backend_id;
    IF NOT FOUND OR NEW.origin_seen OR EXISTS (
            SELECT 1 FROM cycle_groups g
             WHERE g.cycle_id = NEW.id AND g.verdict NOT IN ('tracked', 'ignored')) THEN
        RETURN NULL;
    END IF;
    DELETE FROM retired_coverages WHERE id = cov.id;
    INSERT INTO events (backend_id, cycle_id, kind, message, details)
    VALUES (cov.id, NEW.id, 'coverage_retired',
            format('retired coverage %s of backend %s (%s %s, regions %s) found nothing of it in a clean'
                   ' cycle: no longer listed', cov.id, cov.backend_id, cov.provider, cov.account,
                   array_to_string(cov.regions, ',')),
            jsonb_build_object('from', cov.backend_id, 'account', cov.account, 'regions', to_jsonb(cov.regions)));
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS cycles_coverage_retired ON cycles;
CREATE TRIGGER cycles_coverage_retired AFTER UPDATE OF outcome ON cycles FOR EACH ROW
    WHEN (NEW.outcome = 'clean' AND OLD.outcome IS NULL)
    EXECUTE FUNCTION orphan_cleanup_coverage_retired();

-- Whoever deletes or moves a backend (the platform's role, which may write none of the
-- product's tables) or finishes a cycle (a function's role, which may not write
-- retired_coverages), these write as their owner, the migration's: SECURITY DEFINER, the
-- search_path pinned to this schema. Each runs fixed statements on the row that fired it. They
-- stay with the owner rather than the definer role, so an upgrade needs no new grant of CREATE
-- on the schema (docs/DATABASE.md). Never executable by PUBLIC.
DO $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY['orphan_cleanup_retire_coverage', 'orphan_cleanup_coverage_gone',
                              'orphan_cleanup_coverage_retired', 'orphan_cleanup_refuse_coverage_id'] LOOP
        EXECUTE format('ALTER FUNCTION %I() SECURITY DEFINER SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION orphan_cleanup_retire_coverage() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION orphan_cleanup_refuse_backends_truncate() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION orphan_cleanup_refuse_coverage_id() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION orphan_cleanup_coverage_gone() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION orphan_cleanup_coverage_retired() FROM PUBLIC;
