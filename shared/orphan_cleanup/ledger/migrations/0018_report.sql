-- What ``report`` reads (C3): when each orphan became one (its owner's end, else its
-- creation), when it was deleted, and its size facts as the listing read them (priced
-- with the backend's ``prices`` when the report runs). NULL on rows older than this
-- migration: the report falls back to first_seen and last_seen.
ALTER TABLE orphans ADD COLUMN IF NOT EXISTS orphan_since timestamptz NULL;
ALTER TABLE orphans ADD COLUMN IF NOT EXISTS deleted_at timestamptz NULL;
ALTER TABLE orphans ADD COLUMN IF NOT EXISTS size jsonb NULL;

-- When an orphan's life ended, as ``report`` reads it (ledger/report.py, ``REPORT_END``):
-- never while it is open (infinity), its deletion's time for a deleted one (last_seen
-- before this migration), its last listing for one that went otherwise. The report reads
-- the orphans whose life reaches into its period: these indexes find them without reading
-- a year of closed ones (one for the stack, one per backend).
CREATE INDEX IF NOT EXISTS orphans_report_end_idx ON orphans
    ((CASE WHEN state IN ('open', 'deleting', 'delete_failed') THEN 'infinity'::timestamptz
           WHEN state = 'deleted' THEN coalesce(deleted_at, last_seen) ELSE last_seen END))
    WHERE verdict = 'orphan';
CREATE INDEX IF NOT EXISTS orphans_report_backend_end_idx ON orphans
    (backend_id, (CASE WHEN state IN ('open', 'deleting', 'delete_failed') THEN 'infinity'::timestamptz
                       WHEN state = 'deleted' THEN coalesce(deleted_at, last_seen) ELSE last_seen END))
    WHERE verdict = 'orphan';

-- oc_apply_batch of 0012_journal_rows_and_remembered_protections.sql, but for the orphans
-- upsert's ``orphan_since`` (the classifier's, from the owner's end or the listed creation:
-- core/costs.py ``orphan_since``) and ``size`` (``size_of`` of the listed resources).
CREATE OR REPLACE FUNCTION oc_apply_batch(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    c cycles%ROWTYPE;
    cl cleanup%ROWTYPE;
    n integer;
BEGIN
    -- Lock order everywhere: cleanup row, then cycle row.
    SELECT * INTO cl FROM cleanup
     WHERE backend_id = (SELECT backend_id FROM cycles WHERE id = p->>'cycle_id') FOR SHARE;
    SELECT * INTO c FROM cycles WHERE id = p->>'cycle_id' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'unknown_cycle');
    END IF;
    IF cl.fence IS DISTINCT FROM c.fence OR cl.lease_owner IS DISTINCT FROM c.id OR c.outcome IS NOT NULL THEN
        RETURN jsonb_build_object('status', 'fenced');
    END IF;
    INSERT INTO cycle_batches (cycle_id, seq) VALUES (c.id, (p->>'seq')::int) ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 0 THEN
        RETURN jsonb_build_object('status', 'duplicate');
    END IF;

    INSERT INTO cycle_groups (cycle_id, group_key, provider_ref, region, primary_id, resources, verdict, reason, action,
                              evidence)
    SELECT c.id, x.group_key, x.provider_ref, x.region, x.primary_id, x.resources, x.verdict, x.reason, x.action,
           x.evidence
      FROM jsonb_to_recordset(coalesce(p->'rows', '[]')) AS x(group_key text, provider_ref text, region text,
           primary_id text, resources jsonb, verdict text, reason text, action text, evidence jsonb)
    ON CONFLICT (cycle_id, group_key) DO NOTHING;

    INSERT INTO orphans AS o (backend_id, group_key, provider_ref, region, primary_id, resources, verdict, reason,
                              state, owner_id, owner_name, times_reported, last_cycle_id, orphan_since, size)
    SELECT c.backend_id, x.group_key, x.provider_ref, x.region, x.primary_id, x.resources, x.verdict, x.reason,
           x.state, x.owner_id, x.owner_name, x.reported, c.id, x.orphan_since, x.size
      FROM jsonb_to_recordset(coalesce(p->'orphans', '[]')) AS x(group_key text, provider_ref text, region text,
           primary_id text, resources jsonb, verdict text, reason text, state text, owner_id text,
           owner_name text, reported integer, orphan_since timestamptz, size jsonb)
    ON CONFLICT (backend_id, group_key) DO UPDATE
       SET last_seen = now(), resources = excluded.resources,
           -- The earliest time any listing knew it an orphan (an owner's end the platform
           -- wrote later does not move it); the size as this listing read it.
           orphan_since = least(o.orphan_since, excluded.orphan_since),
           size = coalesce(excluded.size, o.size),
           -- A remembered termination protection (SAFETY.md rule 14) survives a delete cycle's
           -- classification, which sends the group to the deleter's re-read: only that re-read
           -- finding it lifted (a deletion recorded) ends it.
           verdict = CASE WHEN o.state = 'protected' AND o.reason = 'termination_protection'
                               AND excluded.state = 'open' THEN o.verdict ELSE excluded.verdict END,
           reason = CASE WHEN o.state = 'protected' AND o.reason = 'termination_protection'
                              AND excluded.state = 'open' THEN o.reason ELSE excluded.reason END,
           times_reported = o.times_reported + excluded.times_reported,
           last_cycle_id = excluded.last_cycle_id,
           state = CASE WHEN o.state IN ('deleting', 'delete_failed') AND excluded.state = 'open' THEN o.state
                        WHEN o.state = 'protected' AND o.reason = 'termination_protection'
                             AND excluded.state = 'open' THEN o.state
                        ELSE excluded.state END;

    INSERT INTO events (backend_id, cycle_id, kind, message, provider_ref, owner_type, owner_id, owner_name, details)
    SELECT c.backend_id, c.id, x.kind, x.message, x.provider_ref, x.owner_type, x.owner_id, x.owner_name,
           coalesce(x.details, '{}'::jsonb)
      FROM jsonb_to_recordset(coalesce(p->'events', '[]')) AS x(kind text, message text, provider_ref text,
           owner_type text, owner_id text, owner_name text, details jsonb);

    UPDATE cycles
       SET applied_batches = applied_batches + 1,
           groups_listed = groups_listed + coalesce((p->>'groups')::int, 0),
           unsettled = unsettled OR coalesce((p->>'skipped')::boolean, false),
           expected_batches = CASE WHEN coalesce((p->>'last')::boolean, false)
                                   THEN (p->>'batch_count')::int ELSE expected_batches END,
           failures = CASE WHEN coalesce((p->>'last')::boolean, false)
                           THEN coalesce(p->'failures', '[]') ELSE failures END
     WHERE id = c.id
    RETURNING * INTO c;

    RETURN jsonb_build_object(
        'status', 'applied',
        'listing_complete', c.expected_batches IS NOT NULL AND c.applied_batches = c.expected_batches,
        'mode', c.mode,
        'groups_listed', c.groups_listed);
END $$;
