-- `status` and `backend show` read each backend's latest failed cycle: its one-line reason and
-- when it ended (C3 `last_error`, `last_failed_at`). Cycles are kept, so without this index
-- that read walks every clean cycle a backend ever had.
CREATE INDEX IF NOT EXISTS cycles_failed_idx ON cycles (backend_id, started_at DESC) WHERE outcome = 'failed';
