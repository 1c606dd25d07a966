-- SAFETY.md rule 19: an append-only journal of every mutating provider call. A row is
-- written before the call (phase 'intent', with what the provider deletes along with
-- the target: `blast`) and another after it (phase 'result'), outside any cycle's fence:
-- a deletion by a cycle that lost its lease, by a run that was interrupted or whose
-- backend was removed with --force, is still on record.
CREATE TABLE IF NOT EXISTS provider_journal (
    id           bigserial PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT oc_clock(),
    backend_id   text NOT NULL,
    cycle_id     text NULL,
    scope        text NOT NULL,         -- provider:account the call was made in
    region       text NULL,
    provider_ref text NULL,
    group_key    text NULL,
    phase        text NOT NULL CHECK (phase IN ('intent', 'result')),
    intent_id    bigint NULL,           -- a result row: the intent it ends
    call         text NOT NULL,         -- ec2:TerminateInstances, compute.instances.delete, ...
    target       text NOT NULL,         -- the id of the resource the call acts on
    blast        jsonb NOT NULL DEFAULT '[]'::jsonb,
    outcome      text NULL CHECK (outcome IS NULL OR outcome IN ('ok', 'gone', 'refused', 'error')),
    error        text NULL
);
CREATE INDEX IF NOT EXISTS provider_journal_ref_idx ON provider_journal (backend_id, provider_ref, at);
CREATE INDEX IF NOT EXISTS provider_journal_target_idx ON provider_journal (target);
CREATE INDEX IF NOT EXISTS provider_journal_cycle_idx ON provider_journal (cycle_id);
-- Rows are only ever inserted: infra/postgres/roles.sql grants the functions' role INSERT
-- and SELECT on this table and on `events`, never UPDATE or DELETE.

-- SAFETY.md rule 18: the backend as it was when the lease was taken (account, regions,
-- settings with the account's protect and controller keys, mode), which the classifier
-- and the deleter use; an edit of the row applies from the next cycle. NULL on cycles
-- started before this migration (they read the row, as before).
ALTER TABLE cycles ADD COLUMN IF NOT EXISTS backend_snapshot jsonb NULL;
