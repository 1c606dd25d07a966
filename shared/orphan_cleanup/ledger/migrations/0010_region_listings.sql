-- A region's listing that suddenly comes back empty, or much smaller than its last
-- clean listing, is an anomaly (a broken API answer), not a fact: the lister counts
-- that region as not listed for the cycle. Baselines: each region's group count in
-- the backend's last clean cycle, and the count of a listing found suspect since
-- (the next listing that agrees with it is accepted).
ALTER TABLE cycles ADD COLUMN IF NOT EXISTS region_groups jsonb NULL;

CREATE TABLE IF NOT EXISTS region_listings (
    backend_id     text NOT NULL,
    region         text NOT NULL,
    clean_groups   integer NULL,
    clean_cycle_id text NULL,
    clean_at       timestamptz NULL,
    suspect_groups integer NULL,
    suspect_at     timestamptz NULL,
    PRIMARY KEY (backend_id, region)
);

-- A cycle finishing clean makes its per-region counts the new baselines.
CREATE OR REPLACE FUNCTION orphan_cleanup_region_baseline() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO region_listings AS l (backend_id, region, clean_groups, clean_cycle_id, clean_at)
    SELECT NEW.backend_id, r.key, r.value::integer, NEW.id, oc_clock()
      FROM jsonb_each_text(NEW.region_groups) AS r
    ON CONFLICT (backend_id, region) DO UPDATE
       SET clean_groups = excluded.clean_groups, clean_cycle_id = excluded.clean_cycle_id,
           clean_at = excluded.clean_at, suspect_groups = NULL, suspect_at = NULL;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS cycles_region_baseline ON cycles;
CREATE TRIGGER cycles_region_baseline AFTER UPDATE OF outcome ON cycles FOR EACH ROW
    WHEN (NEW.outcome = 'clean' AND OLD.outcome IS NULL AND NEW.region_groups IS NOT NULL)
    EXECUTE FUNCTION orphan_cleanup_region_baseline();
