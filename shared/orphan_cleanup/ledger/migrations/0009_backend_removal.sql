-- `backend remove` deletes the backends row (no future cycle) but keeps its history
-- for audit: cycles (and their batches, groups and delete requests), orphans and the
-- orphan resources seen no longer cascade from backends. The cleanup row (the
-- schedule, the lease and the fence) still goes with the backend.
DO $$
DECLARE
    fk record;
BEGIN
    FOR fk IN
        SELECT c.conrelid::regclass AS tbl, c.conname
          FROM pg_constraint c
         WHERE c.contype = 'f'
           AND c.confrelid = 'backends'::regclass
           AND c.conrelid IN ('cycles'::regclass, 'orphans'::regclass, 'orphan_resources'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fk.tbl, fk.conname);
    END LOOP;
END $$;
