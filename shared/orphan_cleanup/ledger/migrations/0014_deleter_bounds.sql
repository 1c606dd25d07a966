-- What the deleter's role may write, bounded by value where a column grant cannot say it
-- (docs/DATABASE.md, "One role per function"; SAFETY.md rules 12 and 19). The grants
-- themselves are infra/postgres/roles.sql's, as the role names are the operator's.

-- Known orphan resources (migration 0013) only from a deletion of the caller's open cycle:
-- the cycle still holds its backend's lease (not finished, its fence current), the group is
-- an orphan of that cycle whose delete request the deleter took, the cycle's journal shows
-- the group's instance deleted (a delete call on it, accepted: `ok` or `gone`), and each id
-- is a member of the group as the classifier recorded it (what the deleter's re-read shows
-- attached is always a member: providers/deletion.py). A finished cycle adds nothing.
-- What is left: the journal records the blast of the instance's delete, not every attached
-- member (a volume still attached while the instance shuts down has no row of its own), so
-- the function cannot tell a member the re-read showed attached from one it did not; and the
-- deleter's role may append journal rows itself (append-only: `explain` shows them).
CREATE OR REPLACE FUNCTION oc_record_orphan_resources(p_cycle text, p_group text, p_ids text[]) RETURNS integer
LANGUAGE sql SECURITY DEFINER AS $$
    WITH added AS (
        INSERT INTO orphan_resources (backend_id, provider_ref, resource_id)
        SELECT c.backend_id, g.provider_ref, x
          FROM cycles c
          JOIN cleanup cl ON cl.backend_id = c.backend_id AND cl.lease_owner = c.id AND cl.fence = c.fence
          JOIN cycle_groups g ON g.cycle_id = c.id AND g.group_key = p_group AND g.verdict = 'orphan'
               AND g.primary_id IS NOT NULL
          JOIN delete_requests d ON d.cycle_id = c.id AND d.group_key = p_group AND d.state <> 'queued'
          CROSS JOIN (SELECT DISTINCT unnest(p_ids) AS x) ids
         WHERE c.id = p_cycle AND c.mode = 'delete' AND c.outcome IS NULL
           AND x <> g.primary_id
           AND EXISTS (SELECT 1 FROM jsonb_array_elements(g.resources) AS r WHERE r->>'id' = x)
           AND EXISTS (SELECT 1 FROM provider_journal i JOIN provider_journal res
                              ON res.intent_id = i.id AND res.phase = 'result' AND res.outcome IN ('ok', 'gone')
                        WHERE i.cycle_id = c.id AND i.group_key = p_group AND i.phase = 'intent'
                          AND i.target = g.primary_id
                          AND i.call !~ '(Detach|Disassociate|reateSnapshot|Cancel|detach|snapshot)')
        ON CONFLICT DO NOTHING
        RETURNING 1)
    SELECT count(*)::integer FROM added
$$;

-- A writer that may not INSERT into the table (the deleter's role: it records deletions, it
-- never classifies) may change a group's verdict or reason only to `protected` (a protection
-- its deletion found: rule 14); on an orphan row also back to what an open cycle of its
-- backend classified the group (a remembered protection the deletion found lifted). The
-- classifier and the runtime role insert these rows, and may. Not SECURITY DEFINER: it judges
-- the writer (current_user).
CREATE OR REPLACE FUNCTION orphan_cleanup_verdict_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.verdict IS NOT DISTINCT FROM 'protected'
       OR has_table_privilege(current_user, TG_RELID, 'INSERT') THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'orphans' THEN  -- (nested: plpgsql would read NEW.backend_id of a cycle_groups row)
        IF EXISTS (SELECT 1 FROM cycle_groups g JOIN cycles c ON c.id = g.cycle_id
                    WHERE c.backend_id = NEW.backend_id AND c.outcome IS NULL AND g.group_key = NEW.group_key
                      AND g.verdict IS NOT DISTINCT FROM NEW.verdict
                      AND g.reason IS NOT DISTINCT FROM NEW.reason) THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'permission denied: % may set the verdict of % only to protected', current_user, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;

DROP TRIGGER IF EXISTS cycle_groups_verdict_guard ON cycle_groups;
CREATE TRIGGER cycle_groups_verdict_guard BEFORE UPDATE ON cycle_groups FOR EACH ROW
    WHEN (OLD.verdict IS DISTINCT FROM NEW.verdict OR OLD.reason IS DISTINCT FROM NEW.reason)
    EXECUTE FUNCTION orphan_cleanup_verdict_guard();
DROP TRIGGER IF EXISTS orphans_verdict_guard ON orphans;
CREATE TRIGGER orphans_verdict_guard BEFORE UPDATE ON orphans FOR EACH ROW
    WHEN (OLD.verdict IS DISTINCT FROM NEW.verdict OR OLD.reason IS DISTINCT FROM NEW.reason)
    EXECUTE FUNCTION orphan_cleanup_verdict_guard();

-- A delete request handled stays handled for a writer that may not INSERT requests (the
-- deleter's role): queued again, a cycle would delete its group twice.
CREATE OR REPLACE FUNCTION orphan_cleanup_request_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF has_table_privilege(current_user, TG_RELID, 'INSERT') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'permission denied: % may not queue delete request % again', current_user, OLD.group_key
        USING ERRCODE = 'insufficient_privilege';
END $$;

DROP TRIGGER IF EXISTS delete_requests_requeue_guard ON delete_requests;
CREATE TRIGGER delete_requests_requeue_guard BEFORE UPDATE ON delete_requests FOR EACH ROW
    WHEN (NEW.state = 'queued' AND OLD.state IS DISTINCT FROM 'queued')
    EXECUTE FUNCTION orphan_cleanup_request_guard();

-- A finished cycle stays finished, for every writer: its outcome never changes once set. No
-- code re-opens a cycle (an expired lease and `backend remove` fail only unfinished ones), and
-- a re-opened cycle would pass every "open cycle" check above again (a function's role holds
-- the outcome and lease columns, as it finishes cycles and releases leases).
CREATE OR REPLACE FUNCTION orphan_cleanup_finished_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'permission denied: cycle % finished %, and a finished cycle is never re-opened', OLD.id,
        OLD.outcome USING ERRCODE = 'insufficient_privilege';
END $$;

DROP TRIGGER IF EXISTS cycles_finished_guard ON cycles;
CREATE TRIGGER cycles_finished_guard BEFORE UPDATE ON cycles FOR EACH ROW
    WHEN (OLD.outcome IS NOT NULL AND NEW.outcome IS DISTINCT FROM OLD.outcome)
    EXECUTE FUNCTION orphan_cleanup_finished_guard();

-- A group's evidence holds what the classifier read (the listed primary rule 17 and the
-- deleter's checks compare with: `lp`); a writer that may not INSERT groups (the deleter's
-- role) changes only its detail (`d`: the snapshot kept, the protection found).
CREATE OR REPLACE FUNCTION orphan_cleanup_evidence_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF has_table_privilege(current_user, TG_RELID, 'INSERT')
       OR (coalesce(NEW.evidence, '{}'::jsonb) - 'd') = (coalesce(OLD.evidence, '{}'::jsonb) - 'd') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'permission denied: % may change only the detail of a group''s evidence', current_user
        USING ERRCODE = 'insufficient_privilege';
END $$;

DROP TRIGGER IF EXISTS cycle_groups_evidence_guard ON cycle_groups;
CREATE TRIGGER cycle_groups_evidence_guard BEFORE UPDATE ON cycle_groups FOR EACH ROW
    WHEN (OLD.evidence IS DISTINCT FROM NEW.evidence)
    EXECUTE FUNCTION orphan_cleanup_evidence_guard();

-- As migration 0013: the new functions run for no one but through their triggers.
REVOKE EXECUTE ON FUNCTION orphan_cleanup_verdict_guard() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION orphan_cleanup_request_guard() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION orphan_cleanup_finished_guard() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION orphan_cleanup_evidence_guard() FROM PUBLIC;
