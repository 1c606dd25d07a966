-- Mark, then sweep (docs/SAFETY.md rule 23). A delete cycle deletes an orphan group only when
-- an earlier delete-mode listing, at least the confirmation window before its own, already
-- found the same group an orphan for the same reason. One row per group a delete cycle found
-- an orphan: when the run of such listings began (marked_at, the first one's listed_at).
-- The same group: the same key (ref, region, primary) and, for a primary-less group, the same
-- member ids. A listing that does not find it so (another reason, another verdict, not there)
-- ends the row; ledger/locked.py's _SWEEP_SQL says what makes it start over.
CREATE TABLE IF NOT EXISTS orphan_marks (
    backend_id  text NOT NULL REFERENCES backends (id) ON DELETE CASCADE,
    group_key   text NOT NULL,
    reason      text NOT NULL,
    member_ids  text[] NULL,  -- a primary-less group's member ids, sorted; NULL with a primary
    marked_at   timestamptz NOT NULL,
    cycle_id    text NOT NULL,  -- the latest delete cycle that found it so
    PRIMARY KEY (backend_id, group_key)
);

-- A group a delete cycle marked: when it goes (C3 ``detail``; the digest's ``delete_after``).
ALTER TABLE cycle_groups ADD COLUMN IF NOT EXISTS delete_after timestamptz NULL;
