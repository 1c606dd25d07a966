-- The journal's rows tie together (SAFETY.md rule 19): a result row names an existing
-- intent, is its only result, and takes its call, target and cycle from it; every row's time is the
-- database's. A writer can add rows, never make one say another call happened.
DO $$ BEGIN
    ALTER TABLE provider_journal ADD CONSTRAINT provider_journal_intent_fk
        FOREIGN KEY (intent_id) REFERENCES provider_journal (id);
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
ALTER TABLE provider_journal DROP CONSTRAINT IF EXISTS provider_journal_phase_check;
ALTER TABLE provider_journal ADD CONSTRAINT provider_journal_phase_check
    CHECK ((phase = 'intent' AND intent_id IS NULL AND outcome IS NULL)
        OR (phase = 'result' AND intent_id IS NOT NULL AND outcome IS NOT NULL));

CREATE OR REPLACE FUNCTION orphan_cleanup_journal_row() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    i provider_journal%ROWTYPE;
BEGIN
    NEW.at := oc_clock();
    IF NEW.phase = 'result' THEN
        SELECT * INTO i FROM provider_journal WHERE id = NEW.intent_id AND phase = 'intent';
        IF NOT FOUND THEN
            RAISE EXCEPTION 'journal result row %: no intent row %', NEW.id, NEW.intent_id;
        END IF;
        NEW.backend_id := i.backend_id; NEW.cycle_id := i.cycle_id; NEW.scope := i.scope;
        NEW.region := i.region; NEW.provider_ref := i.provider_ref; NEW.group_key := i.group_key;
        NEW.call := i.call; NEW.target := i.target; NEW.blast := i.blast;
    END IF;
    RETURN NEW;
END $$;

-- One result per intent: a later row cannot make a failed call say it succeeded.
CREATE UNIQUE INDEX IF NOT EXISTS provider_journal_one_result ON provider_journal (intent_id)
    WHERE phase = 'result';

DROP TRIGGER IF EXISTS provider_journal_row ON provider_journal;
CREATE TRIGGER provider_journal_row BEFORE INSERT ON provider_journal
    FOR EACH ROW EXECUTE FUNCTION orphan_cleanup_journal_row();

-- oc_apply_batch of 0008_evidence.sql, but for two things. The orphans upsert: a
-- remembered termination protection stays remembered when a delete cycle classifies the
-- group an orphan to re-read it (SAFETY.md rule 14). And no orphan_resources from a
-- listing: only the deleter's re-read says what was attached to an orphan VM (rule 15).
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
                              state, owner_id, owner_name, times_reported, last_cycle_id)
    SELECT c.backend_id, x.group_key, x.provider_ref, x.region, x.primary_id, x.resources, x.verdict, x.reason,
           x.state, x.owner_id, x.owner_name, x.reported, c.id
      FROM jsonb_to_recordset(coalesce(p->'orphans', '[]')) AS x(group_key text, provider_ref text, region text,
           primary_id text, resources jsonb, verdict text, reason text, state text, owner_id text,
           owner_name text, reported integer)
    ON CONFLICT (backend_id, group_key) DO UPDATE
       SET last_seen = now(), resources = excluded.resources,
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
