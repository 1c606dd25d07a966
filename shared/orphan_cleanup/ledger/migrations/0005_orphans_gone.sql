-- An orphan no longer listed in a region that listed cleanly is closed as 'gone'.
ALTER TABLE orphans DROP CONSTRAINT IF EXISTS orphans_state_check;
ALTER TABLE orphans ADD CONSTRAINT orphans_state_check
    CHECK (state IN ('open', 'deleting', 'deleted', 'delete_failed', 'protected', 'gone'));
