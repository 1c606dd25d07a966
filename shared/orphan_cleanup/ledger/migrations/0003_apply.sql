-- Fenced, idempotent batch application in one round trip (SAFETY.md rule 6).

ALTER TABLE cycles ADD COLUMN IF NOT EXISTS record_all boolean NOT NULL DEFAULT false;
ALTER TABLE cycles ADD COLUMN IF NOT EXISTS manual boolean NOT NULL DEFAULT false;
ALTER TABLE cycles ADD COLUMN IF NOT EXISTS dispatched boolean NOT NULL DEFAULT false;
ALTER TABLE cycles ADD COLUMN IF NOT EXISTS blocked_reason text NULL;

-- p: {cycle_id, seq, last, batch_count, failures, groups, skipped,
--     rows: [cycle_groups rows], orphans: [orphans rows], orphan_resources: [...], events: [...]}
-- Returns {status: applied|duplicate|fenced|unknown_cycle, listing_complete, ...counters}.
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

    INSERT INTO cycle_groups (cycle_id, group_key, provider_ref, region, primary_id, resources, verdict, reason, action)
    SELECT c.id, x.group_key, x.provider_ref, x.region, x.primary_id, x.resources, x.verdict, x.reason, x.action
      FROM jsonb_to_recordset(coalesce(p->'rows', '[]')) AS x(group_key text, provider_ref text, region text,
           primary_id text, resources jsonb, verdict text, reason text, action text)
    ON CONFLICT (cycle_id, group_key) DO NOTHING;

    INSERT INTO orphans AS o (backend_id, group_key, provider_ref, region, primary_id, resources, verdict, reason,
                              state, owner_id, owner_name, times_reported, last_cycle_id)
    SELECT c.backend_id, x.group_key, x.provider_ref, x.region, x.primary_id, x.resources, x.verdict, x.reason,
           x.state, x.owner_id, x.owner_name, x.reported, c.id
      FROM jsonb_to_recordset(coalesce(p->'orphans', '[]')) AS x(group_key text, provider_ref text, region text,
           primary_id text, resources jsonb, verdict text, reason text, state text, owner_id text,
           owner_name text, reported integer)
    ON CONFLICT (backend_id, group_key) DO UPDATE
       SET last_seen = now(), resources = excluded.resources, verdict = excluded.verdict,
           reason = excluded.reason, times_reported = o.times_reported + excluded.times_reported,
           last_cycle_id = excluded.last_cycle_id,
           state = CASE WHEN o.state IN ('deleting', 'delete_failed') AND excluded.state = 'open'
                        THEN o.state ELSE excluded.state END;

    INSERT INTO orphan_resources (backend_id, provider_ref, resource_id)
    SELECT c.backend_id, x.provider_ref, x.resource_id
      FROM jsonb_to_recordset(coalesce(p->'orphan_resources', '[]')) AS x(provider_ref text, resource_id text)
    ON CONFLICT DO NOTHING;

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
