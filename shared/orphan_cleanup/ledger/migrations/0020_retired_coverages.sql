-- Coverage never shrinks silently (docs/SAFETY.md rule 24). When a backends row is deleted, or
-- its provider account (a GCP backend's project included) or regions change, what it covered
-- stays listed as a retired coverage: the provider, account, the regions no longer covered and
-- the last settings and mode. A trigger captures it, so the platform's plain SQL is caught as
-- well as `backend remove`.
--
-- A retired coverage runs on the tick like a backend, under its own id ('<backend id>~<n>': no
-- backend id the CLI accepts holds a '~'), with the backend's last mode (lowered, never raised,
-- by the backend's row while it exists), never loosened: it
-- deletes only when that mode (else the stack's) and the stack's ceiling say delete; an 'off'
-- one is shown, never run. It retires itself, with an event, after two clean cycles in a row
-- that recorded no group needing a decision and found no group whose owner names the backend it
-- came from (cycles.origin_seen); when its backend lists its account and regions again; or when
-- an operator drops it (`backend forget-coverage`, an event).
CREATE TABLE IF NOT EXISTS retired_coverages (
    id          text PRIMARY KEY,
    backend_id  text NOT NULL,            -- the backend it came from
    provider    text NOT NULL,
    account     text NOT NULL,
    regions     text[] NOT NULL,
    settings    jsonb NOT NULL,
    mode        text NULL CHECK (mode IS NULL OR mode IN ('report', 'delete', 'off')),  -- the backend's last
    why         text NOT NULL CHECK (why IN ('removed', 'moved')),
    retired_at  timestamptz NOT NULL DEFAULT oc_clock(),
    quiet_cycles integer NOT NULL DEFAULT 0  -- clean cycles in a row that found nothing of it
);
CREATE INDEX IF NOT EXISTS retired_coverages_backend_idx ON retired_coverages (backend_id);
CREATE SEQUENCE IF NOT EXISTS retired_coverages_seq;

-- What the tick runs: every backend, and every retired coverage under its own id, with the
-- backend it came from (retired_from: NULL for a backend) and the backend id owners name for
-- what it covers (origin). A SQL function, not a view: the planner inlines it as a view, and no
-- column of the platform's backends table depends on it (a view would refuse the platform's
-- own ALTER COLUMN ... TYPE, and DROP ... CASCADE would drop it). It names its tables with this
-- schema rather than pinning its search_path (migrate pins the others), which would stop the
-- planner from inlining it; it reads with its caller's rights, so anyone may call it.
DO $do$
BEGIN
    EXECUTE format($fn$
CREATE OR REPLACE FUNCTION %1$I.coverages()
RETURNS TABLE (id text, provider text, account text, regions text[], settings jsonb, mode text,
               retired_from text, origin text)
LANGUAGE sql STABLE AS $body$
    SELECT b.id::text, b.provider::text, b.account::text, b.regions::text[], b.settings::jsonb, b.mode::text,
           NULL::text, b.id::text
      FROM %1$I.backends b
    UNION ALL
    -- a coverage's mode is its backend's last, lowered (never raised) by the backend's row
    -- while it exists: an operator who turns the backend off or to report turns its coverages too
    SELECT c.id, c.provider, c.account, c.regions, c.settings,
           CASE WHEN o.mode::text = 'off' THEN 'off'
                WHEN o.mode::text = 'report' AND c.mode IS DISTINCT FROM 'off' THEN 'report'
                ELSE c.mode END,
           c.backend_id, c.backend_id
      FROM %1$I.retired_coverages c LEFT JOIN %1$I.backends o ON o.id = c.backend_id
$body$
$fn$, current_schema());
END $do$;
GRANT EXECUTE ON FUNCTION coverages() TO PUBLIC;

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

-- ``provider:account`` of a backends or retired_coverages row, as queries.SCOPE_SQL says it.
CREATE OR REPLACE FUNCTION orphan_cleanup_scope(provider text, account text, settings jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT provider || ':' || CASE WHEN provider = 'gcp'
        THEN coalesce(nullif(settings->>'project', ''), account) ELSE account END
$$;

CREATE OR REPLACE FUNCTION orphan_cleanup_retire_coverage() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    gone text[];
    cov text;
    absorbed retired_coverages%ROWTYPE;
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        -- A backend that lists its own coverage's account and regions again (a row deleted and
        -- inserted again, a region dropped and added back) takes them over: they leave the
        -- coverage, and a coverage left with none retires, with an event.
        UPDATE retired_coverages c
           SET regions = ARRAY(SELECT r FROM unnest(c.regions) AS r WHERE NOT r = ANY(NEW.regions) ORDER BY r)
         WHERE c.backend_id = NEW.id AND orphan_cleanup_scope(c.provider, c.account, c.settings)
               = orphan_cleanup_scope(NEW.provider, NEW.account, NEW.settings)
           AND c.regions && NEW.regions;
        FOR absorbed IN DELETE FROM retired_coverages c WHERE cardinality(c.regions) = 0 RETURNING * LOOP
            INSERT INTO events (backend_id, kind, message, details)
            VALUES (absorbed.id, 'coverage_retired',
                    format('retired coverage %s of backend %s (%s %s): backend %s lists its regions again:'
                           ' no longer listed as a retired coverage', absorbed.id, absorbed.backend_id,
                           absorbed.provider, absorbed.account, NEW.id),
                    jsonb_build_object('from', absorbed.backend_id, 'account', absorbed.account,
                                       'listed_by', NEW.id));
        END LOOP;
    END IF;
    IF TG_OP = 'INSERT' THEN
        RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
        DELETE FROM cleanup WHERE backend_id = OLD.id;
        DELETE FROM orphan_marks WHERE backend_id = OLD.id;
        -- the row's last mode keeps lowering its earlier coverages (coverages() lowers them by
        -- the row only while it exists)
        UPDATE retired_coverages c
           SET mode = CASE WHEN OLD.mode = 'off' THEN 'off'
                           WHEN OLD.mode = 'report' AND c.mode IS DISTINCT FROM 'off' THEN 'report'
                           ELSE c.mode END
         WHERE c.backend_id = OLD.id;
        gone := OLD.regions;
    ELSIF orphan_cleanup_scope(NEW.provider, NEW.account, NEW.settings)
          IS DISTINCT FROM orphan_cleanup_scope(OLD.provider, OLD.account, OLD.settings) THEN
        gone := OLD.regions;
    ELSE
        gone := ARRAY(SELECT r FROM unnest(OLD.regions) AS r WHERE NOT r = ANY(coalesce(NEW.regions, '{}'))
                      ORDER BY r);
    END IF;
    IF coalesce(cardinality(gone), 0) = 0 THEN
        RETURN NULL;
    END IF;
    LOOP  -- an id no backends row holds (plain SQL may have written one with a '~')
        cov := OLD.id || '~' || nextval('retired_coverages_seq');
        EXIT WHEN NOT EXISTS (SELECT 1 FROM backends WHERE id = cov);
    END LOOP;
    INSERT INTO retired_coverages (id, backend_id, provider, account, regions, settings, mode, why)
    VALUES (cov, OLD.id, OLD.provider, OLD.account, gone, OLD.settings, OLD.mode,
            CASE WHEN TG_OP = 'DELETE' THEN 'removed' ELSE 'moved' END);
    -- Its regions' baselines (a listing that suddenly finds nothing is not believed: the
    -- lister's region anomaly check) are the backend's.
    INSERT INTO region_listings (backend_id, region, clean_groups, clean_cycle_id, clean_at)
    SELECT cov, l.region, l.clean_groups, l.clean_cycle_id, l.clean_at FROM region_listings l
     WHERE l.backend_id = OLD.id AND l.region = ANY(gone);
    INSERT INTO events (backend_id, kind, message, details)
    VALUES (cov, 'coverage_retained',
            format('backend %s %s: %s %s, regions %s, stays listed as %s', OLD.id,
                   CASE WHEN TG_OP = 'DELETE' THEN 'was removed' ELSE 'moved' END,
                   OLD.provider, OLD.account, array_to_string(gone, ','), cov),
            jsonb_build_object('from', OLD.id, 'account', OLD.account, 'regions', to_jsonb(gone),
                               'mode', OLD.mode));
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS backends_retire_coverage ON backends;
CREATE TRIGGER backends_retire_coverage AFTER INSERT OR DELETE OR UPDATE OF provider, account, regions, settings
    ON backends FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_retire_coverage();

-- A backends row may not take a retired coverage's id: the two would share one schedule, one
-- lease and one id in every cycle. Nor may an enrolled backend change its id: its schedule,
-- marks and cycles name it (the foreign key migration 0020 drops refused that too).
CREATE OR REPLACE FUNCTION orphan_cleanup_refuse_coverage_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM retired_coverages WHERE id = NEW.id) THEN
        RAISE EXCEPTION 'backend id % is the id of a retired coverage (orphan-cleanup, docs/SAFETY.md rule 24):'
                        ' choose another id', NEW.id;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.id IS DISTINCT FROM OLD.id
       AND EXISTS (SELECT 1 FROM cleanup WHERE backend_id = OLD.id) THEN
        RAISE EXCEPTION 'backend % cannot change its id: orphan-cleanup''s schedule and cycles name it'
                        ' (delete the row and insert one: what it covered stays listed, docs/SAFETY.md rule 24)',
                        OLD.id;
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
-- skipped, protected) and found no group whose owner names the backend it came from is quiet;
-- any other clean cycle is not. After two quiet cycles in a row nothing of that backend is left
-- there: the coverage retires itself, with an event. After the first, the coverage is due again
-- (activity: STEP 1 lists it at its next turn) for the second to confirm it.
CREATE OR REPLACE FUNCTION orphan_cleanup_coverage_retired() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cov retired_coverages%ROWTYPE;
BEGIN
    SELECT * INTO cov FROM retired_coverages WHERE id = NEW.backend_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NEW.origin_seen OR EXISTS (SELECT 1 FROM cycle_groups g
                                   WHERE g.cycle_id = NEW.id AND g.verdict NOT IN ('tracked', 'ignored')) THEN
        UPDATE retired_coverages SET quiet_cycles = 0 WHERE id = cov.id;
        RETURN NULL;
    END IF;
    IF cov.quiet_cycles < 1 THEN
        UPDATE retired_coverages SET quiet_cycles = quiet_cycles + 1 WHERE id = cov.id;
        INSERT INTO ledger_activity (backend_id, kind) VALUES (cov.id, 'coverage_quiet');
        RETURN NULL;
    END IF;
    DELETE FROM retired_coverages WHERE id = cov.id;
    INSERT INTO events (backend_id, cycle_id, kind, message, details)
    VALUES (cov.id, NEW.id, 'coverage_retired',
            format('retired coverage %s of backend %s (%s %s, regions %s) found nothing of it in two clean'
                   ' cycles in a row: no longer listed', cov.id, cov.backend_id, cov.provider, cov.account,
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
REVOKE EXECUTE ON FUNCTION orphan_cleanup_scope(text, text, jsonb) FROM PUBLIC;
