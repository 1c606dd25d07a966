-- One database role per function (docs/DATABASE.md, "Roles"; SAFETY.md rule 19): the
-- grants themselves are infra/postgres/roles.sql's, as the role names are the operator's.
-- What the schema does here:
--
-- A cycle that finishes clean makes its region counts the new baselines. The classifier
-- or the deleter may be the one finishing it, and neither may write region_listings
-- itself: the trigger writes it as its owner (SECURITY DEFINER, search_path pinned;
-- roles.sql hands it to a NOLOGIN owner holding only those rights).
ALTER FUNCTION orphan_cleanup_region_baseline() SECURITY DEFINER;

-- What the deleter saw attached to an orphan VM it terminated becomes known orphan
-- resources of its ref (their leftovers stay orphans later). The deleter may not write
-- orphan_resources itself: through this function it adds ids only under the ref of a group
-- its cycle, a delete cycle, classified an orphan and asked it to delete.
CREATE OR REPLACE FUNCTION oc_record_orphan_resources(p_cycle text, p_group text, p_ids text[]) RETURNS integer
LANGUAGE sql SECURITY DEFINER AS $$
    WITH added AS (
        INSERT INTO orphan_resources (backend_id, provider_ref, resource_id)
        SELECT c.backend_id, g.provider_ref, x
          FROM cycles c
          JOIN cycle_groups g ON g.cycle_id = c.id AND g.group_key = p_group AND g.verdict = 'orphan'
          JOIN delete_requests d ON d.cycle_id = c.id AND d.group_key = p_group AND d.state <> 'queued'
          CROSS JOIN unnest(p_ids) AS x
         WHERE c.id = p_cycle AND c.mode = 'delete'
        ON CONFLICT DO NOTHING
        RETURNING 1)
    SELECT count(*)::integer FROM added
$$;

-- The product's functions run for the roles roles.sql grants them to, never for PUBLIC
-- (trigger functions need no EXECUTE of the writer: PostgreSQL checks it when a trigger
-- is created, not when it fires). But the database clock, oc_clock(): any role that may
-- read the ledger (the read-only commands) reads its time.
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace AND p.proowner = current_user::regrole
                AND p.proname <> 'oc_clock'
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
GRANT EXECUTE ON FUNCTION oc_clock() TO PUBLIC;
