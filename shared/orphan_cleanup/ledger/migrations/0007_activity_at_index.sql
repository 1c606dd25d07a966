-- STEP 1 also counts activity rows that name no backend row (an owner written with a
-- backend id the ledger does not know): that branch reads the log by time alone.
CREATE INDEX IF NOT EXISTS ledger_activity_at_idx ON ledger_activity (at);
