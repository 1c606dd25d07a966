-- One database role per function: included by roles.sql (\ir), inside its transaction,
-- with its psql variables. docs/DATABASE.md, "One role per function", has the same grants
-- as a table, which tests/integration/test_db_roles.py compares with pg_catalog.
--
-- Each role reads every table (the C1 tables, the log, the product's), and writes only what
-- its function's statements write. None may update or delete the audit trail (events,
-- provider_journal, cycle_batches, orphan_resources: SAFETY.md rule 19); only the deleter
-- deletes, and only gates. What the deleter trusts (the cycle's mode and snapshot, its
-- groups, its delete requests, the known orphan resources) neither the lister nor the
-- deleter can write.

-- ---- start from nothing: a rerun takes back what a list no longer gives ---------------
SELECT format('REVOKE ALL ON TABLE %I.%I FROM %I, %I, %I, %I', n.nspname, c.relname, :'lister_role',
              :'classifier_role', :'deleter_role', :'definer_role'),
       format('GRANT SELECT ON TABLE %I.%I TO %I, %I, %I', n.nspname, c.relname, :'lister_role',
              :'classifier_role', :'deleter_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p')
   AND (c.relowner = (SELECT oid FROM pg_roles WHERE rolname = :'owner_role')
        OR c.relname IN ('backends', 'provider_refs', 'instances'))
\gexec
SELECT format('REVOKE ALL ON SEQUENCE %I.%I FROM %I, %I, %I', n.nspname, c.relname, :'lister_role',
              :'classifier_role', :'deleter_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind = 'S'
\gexec
SELECT format('REVOKE ALL ON FUNCTION %s FROM %I, %I, %I', p.oid::regprocedure, :'lister_role',
              :'classifier_role', :'deleter_role')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema'
\gexec

-- ---- what each function writes ---------------------------------------------------------
-- lister: enrolls backends and takes their lease (cleanup), starts cycles and records their
--         listing (cycles, region_listings), fails a cycle it finds past its deadline.
-- classifier: applies batches (cycle_batches, cycle_groups, orphans, orphan_resources,
--         events, oc_apply_batch), dispatches deletes (delete_requests), finishes cycles.
-- deleter: takes and releases gates, journals its provider calls, records each delete's
--         result, finishes cycles.
SELECT format('GRANT %s ON TABLE %I.%I TO %I', g.privileges, :'schema', g.tbl, g.grantee)
  FROM (VALUES
    (:'lister_role', 'cleanup', 'INSERT, UPDATE'),
    (:'lister_role', 'cycles', 'INSERT'),
    (:'lister_role', 'region_listings', 'INSERT, UPDATE'),
    (:'lister_role', 'events', 'INSERT'),
    (:'classifier_role', 'cleanup', 'UPDATE'),
    (:'classifier_role', 'cycle_batches', 'INSERT'),
    (:'classifier_role', 'cycle_groups', 'INSERT, UPDATE'),
    (:'classifier_role', 'orphans', 'INSERT, UPDATE'),
    (:'classifier_role', 'orphan_resources', 'INSERT'),
    (:'classifier_role', 'delete_requests', 'INSERT'),
    (:'classifier_role', 'events', 'INSERT'),
    (:'deleter_role', 'cleanup', 'UPDATE'),
    (:'deleter_role', 'cycle_groups', 'UPDATE'),
    (:'deleter_role', 'orphans', 'UPDATE'),
    (:'deleter_role', 'delete_requests', 'UPDATE'),
    (:'deleter_role', 'delete_gates', 'INSERT, UPDATE, DELETE'),
    (:'deleter_role', 'events', 'INSERT')
  ) AS g(grantee, tbl, privileges)
 WHERE to_regclass(format('%I.%I', :'schema', g.tbl)) IS NOT NULL
\gexec
-- A cycle's own facts (backend, fence, mode, snapshot: SAFETY.md rule 18) are written once,
-- by the lister; every function may move its progress.
SELECT format('GRANT UPDATE (listed_at, deadline, expected_batches, applied_batches, groups_listed, open_deletes,'
              ' planned_deletes, failures, unsettled, failed, error, tripped_regions, outcome, finished_at,'
              ' dispatched, blocked_reason, region_groups) ON TABLE %I.cycles TO %I, %I, %I', :'schema',
              :'lister_role', :'classifier_role', :'deleter_role')
 WHERE to_regclass(format('%I.cycles', :'schema')) IS NOT NULL
\gexec
-- A journal row's id and time are the database's; only the deleter calls what it journals.
SELECT format('GRANT INSERT (backend_id, cycle_id, scope, region, provider_ref, group_key, phase, intent_id, call,'
              ' target, blast, outcome, error) ON TABLE %I.provider_journal TO %I', :'schema', :'deleter_role')
 WHERE to_regclass(format('%I.provider_journal', :'schema')) IS NOT NULL
\gexec
SELECT format('GRANT USAGE ON SEQUENCE %s TO %I', pg_get_serial_sequence(format('%I.%I', :'schema', g.tbl), 'id'),
              g.grantee)
  FROM (VALUES (:'lister_role', 'events'), (:'classifier_role', 'events'), (:'deleter_role', 'events'),
               (:'deleter_role', 'provider_journal')) AS g(grantee, tbl)
 WHERE to_regclass(format('%I.%I', :'schema', g.tbl)) IS NOT NULL
   AND pg_get_serial_sequence(format('%I.%I', :'schema', g.tbl), 'id') IS NOT NULL
\gexec
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, g.grantee)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
  JOIN (VALUES (:'lister_role', 'oc_clock'), (:'classifier_role', 'oc_clock'), (:'deleter_role', 'oc_clock'),
               (:'classifier_role', 'oc_apply_batch'), (:'deleter_role', 'oc_record_orphan_resources'))
       AS g(grantee, fn) ON g.fn = p.proname
 WHERE n.nspname = :'schema'
\gexec

-- ---- the definer: writes behind SECURITY DEFINER functions ------------------------------
-- A cycle finishing clean makes its region counts the baselines (the trigger of migration
-- 0010, SECURITY DEFINER since 0013): whichever function finishes the cycle, the trigger
-- writes region_listings as the definer, which may do that and nothing else.
-- A new owner needs CREATE on the schema (unless a superuser runs this): held only while
-- the functions change hands.
GRANT CREATE ON SCHEMA :"schema" TO :"definer_role";
SELECT format('ALTER FUNCTION %s OWNER TO %I', p.oid::regprocedure, :'definer_role'),
       format('ALTER FUNCTION %s SECURITY DEFINER', p.oid::regprocedure),
       format('ALTER FUNCTION %s SET search_path = %I, pg_temp', p.oid::regprocedure, :'schema'),
       format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', p.oid::regprocedure)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema' AND p.proname IN ('orphan_cleanup_region_baseline', 'oc_record_orphan_resources')
\gexec
REVOKE CREATE ON SCHEMA :"schema" FROM :"definer_role";
-- The deleter's known orphan resources (oc_record_orphan_resources, migration 0013): only under
-- the ref of a group its delete cycle classified an orphan and asked it to delete.
SELECT format('GRANT %s ON TABLE %I.%I TO %I', g.privileges, :'schema', g.tbl, :'definer_role')
  FROM (VALUES ('region_listings', 'SELECT, INSERT, UPDATE'), ('orphan_resources', 'INSERT'),
               ('cycles', 'SELECT'), ('cycle_groups', 'SELECT'), ('delete_requests', 'SELECT')) AS g(tbl, privileges)
 WHERE to_regclass(format('%I.%I', :'schema', g.tbl)) IS NOT NULL
\gexec
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, :'definer_role')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema' AND p.proname = 'oc_clock'
\gexec
