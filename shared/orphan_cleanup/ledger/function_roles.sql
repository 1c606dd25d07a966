-- One database role per function: included by grants.sql (\ir), so by roles.sql inside its
-- transaction with its psql variables, and by `orphan-cleanup migrate` (ledger/grants.py).
-- docs/DATABASE.md, "One role per function", has the same grants as a table, which
-- tests/integration/test_db_function_roles.py compares with pg_catalog
-- (tests/integration/test_db_grants_catalog.py: every grant, and every other write refused).
--
-- Each role reads every table (the C1 tables, the log, the product's), and writes only what
-- its function's statements write. None may update or delete the audit trail (events,
-- provider_journal, cycle_batches, orphan_resources: SAFETY.md rule 19); only the deleter
-- deletes, and only gates. What the deleter trusts (the cycle's mode and snapshot, its
-- groups, its delete requests, the known orphan resources) neither the lister nor the
-- deleter can write; the deleter's UPDATE grants name the columns its statements update,
-- and triggers (migration 0014) bound the values: no verdict but `protected`, no request
-- queued again.

-- ---- start from nothing: a rerun takes back what a list no longer gives ---------------
SELECT format('REVOKE ALL ON TABLE %I.%I FROM %I, %I, %I, %I', n.nspname, c.relname, :'lister_role',
              :'classifier_role', :'deleter_role', :'definer_role'),
       format('GRANT SELECT ON TABLE %I.%I TO %I, %I, %I', n.nspname, c.relname, :'lister_role',
              :'classifier_role', :'deleter_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p')
   AND (c.relowner = (SELECT oid FROM pg_roles WHERE rolname = :'owner_role')
        OR c.relname IN ('backends', 'provider_refs', 'instances', 'volumes'))
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
-- Each UPDATE grant names the columns its function's statements update (ledger/locked.py,
-- session.py, store.py, oc_apply_batch), nothing more (docs/DATABASE.md, the grants table;
-- tests/integration/test_db_grants_catalog.py declares the same lists and tries every other
-- write). Inserts are whole rows.
-- lister: enrolls backends and takes their lease (cleanup, its fence), starts cycles and
--         records their listing (cycles, its region counts: region_groups, which only it
--         writes; region_listings' suspect counts), fails a cycle it finds past its deadline.
-- classifier: applies batches (cycle_batches, cycle_groups, orphans, events, oc_apply_batch),
--         dispatches deletes (delete_requests), finishes cycles. No orphan_resources: a
--         listing never says what an orphan VM had attached (migration 0012).
-- deleter: takes and releases gates, journals its provider calls, records each delete's
--         result (a request's state, a group's action, error and a protection found:
--         verdict `protected` only, and never a request queued again: migration 0014's
--         triggers), finishes cycles; its known orphan resources only through
--         oc_record_orphan_resources.
-- Finishing a cycle (STEP 7) writes the lease row's schedule and releases the lease.
SELECT format('GRANT %s ON TABLE %I.%I TO %I', g.privileges, :'schema', g.tbl, g.grantee)
  FROM (VALUES
    (:'lister_role', 'cleanup', 'INSERT'),
    (:'lister_role', 'cleanup', 'UPDATE (fence, lease_owner, lease_expires_at, clean_at, clean_mode,'
                                ' last_processed_at, next_due_at, retry_delay_seconds, last_outcome, last_error)'),
    (:'lister_role', 'cycles', 'INSERT'),
    (:'lister_role', 'cycles', 'UPDATE (listed_at, region_groups, failures, failed, error, outcome, finished_at)'),
    (:'lister_role', 'region_listings', 'INSERT'),
    (:'lister_role', 'region_listings', 'UPDATE (suspect_groups, suspect_at)'),
    (:'lister_role', 'events', 'INSERT'),
    (:'classifier_role', 'cleanup', 'UPDATE (lease_owner, lease_expires_at, clean_at, clean_mode, last_processed_at,'
                                    ' next_due_at, retry_delay_seconds, last_outcome, last_error)'),
    (:'classifier_role', 'cycles', 'UPDATE (applied_batches, groups_listed, unsettled, expected_batches, failures,'
                                   ' dispatched, blocked_reason, open_deletes, planned_deletes, outcome, finished_at, origin_seen)'),
    (:'classifier_role', 'cycle_batches', 'INSERT'),
    (:'classifier_role', 'cycle_groups', 'INSERT'),
    (:'classifier_role', 'cycle_groups', 'UPDATE (action, delete_after)'),
    (:'classifier_role', 'orphans', 'INSERT'),
    (:'classifier_role', 'orphans', 'UPDATE (last_seen, resources, verdict, reason, times_reported, last_cycle_id,'
                                    ' state, orphan_since, size, deleted_at)'),
    (:'classifier_role', 'orphan_marks', 'INSERT, DELETE'),
    (:'classifier_role', 'orphan_marks', 'UPDATE (reason, member_ids, marked_at, cycle_id)'),
    (:'classifier_role', 'delete_requests', 'INSERT'),
    (:'classifier_role', 'events', 'INSERT'),
    (:'deleter_role', 'cleanup', 'UPDATE (lease_owner, lease_expires_at, clean_at, clean_mode, last_processed_at,'
                                 ' next_due_at, retry_delay_seconds, last_outcome, last_error)'),
    (:'deleter_role', 'cycles', 'UPDATE (open_deletes, unsettled, failed, tripped_regions, error, outcome,'
                                ' finished_at)'),
    (:'deleter_role', 'cycle_groups', 'UPDATE (action, error, updated_at, evidence, verdict, reason)'),
    (:'deleter_role', 'orphans', 'UPDATE (state, last_error, verdict, reason, deleted_at)'),
    (:'deleter_role', 'delete_requests', 'UPDATE (state, attempts, result, updated_at)'),
    (:'deleter_role', 'delete_gates', 'INSERT, DELETE'),
    (:'deleter_role', 'delete_gates', 'UPDATE (holder, expires_at)'),
    (:'deleter_role', 'events', 'INSERT')
  ) AS g(grantee, tbl, privileges)
 WHERE to_regclass(format('%I.%I', :'schema', g.tbl)) IS NOT NULL
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
               (:'lister_role', 'coverages'), (:'classifier_role', 'coverages'), (:'deleter_role', 'coverages'),
               (:'classifier_role', 'oc_apply_batch'), (:'deleter_role', 'oc_record_orphan_resources'))
       AS g(grantee, fn) ON g.fn = p.proname
 WHERE n.nspname = :'schema'
\gexec

-- ---- the definer: writes behind SECURITY DEFINER functions ------------------------------
-- A cycle finishing clean makes its region counts the baselines (the trigger of migration
-- 0010, SECURITY DEFINER since 0013): whichever function finishes the cycle, the trigger
-- writes region_listings as the definer, which may do that and nothing else.
-- A new owner needs CREATE on the schema (unless a superuser runs this): held only while
-- the functions change hands, and only when one does (a function a migration replaced keeps
-- its owner and its grants), as `migrate` running this as the owner role may not grant CREATE
-- on a schema it does not own (it then applies nothing and names roles.sql: ledger/grants.py).
SELECT format('GRANT CREATE ON SCHEMA %I TO %I', :'schema', :'definer_role')
 WHERE EXISTS (SELECT FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = :'schema'
                  AND p.proname IN ('orphan_cleanup_region_baseline', 'oc_record_orphan_resources')
                  AND pg_get_userbyid(p.proowner) <> :'definer_role')
\gexec
SELECT format('ALTER FUNCTION %s OWNER TO %I', p.oid::regprocedure, :'definer_role')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema' AND p.proname IN ('orphan_cleanup_region_baseline', 'oc_record_orphan_resources')
   AND pg_get_userbyid(p.proowner) <> :'definer_role'
\gexec
SELECT format('ALTER FUNCTION %s SECURITY DEFINER', p.oid::regprocedure),
       format('ALTER FUNCTION %s SET search_path = %I, pg_temp', p.oid::regprocedure, :'schema'),
       format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', p.oid::regprocedure)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema' AND p.proname IN ('orphan_cleanup_region_baseline', 'oc_record_orphan_resources')
\gexec
SELECT format('REVOKE CREATE ON SCHEMA %I FROM %I', :'schema', :'definer_role')
 WHERE has_schema_privilege(:'definer_role', :'schema', 'CREATE')
\gexec
-- The deleter's known orphan resources (oc_record_orphan_resources, migrations 0013 and 0014):
-- only while its delete cycle holds the lease, under a group that cycle classified an orphan
-- and asked it to delete, whose instance the cycle's journal shows deleted, and only members
-- of that group.
SELECT format('GRANT %s ON TABLE %I.%I TO %I', g.privileges, :'schema', g.tbl, :'definer_role')
  FROM (VALUES ('region_listings', 'SELECT, INSERT'),
               ('region_listings', 'UPDATE (clean_groups, clean_cycle_id, clean_at, suspect_groups, suspect_at)'),
               ('orphan_resources', 'INSERT'), ('cycles', 'SELECT'), ('cleanup', 'SELECT'),
               ('cycle_groups', 'SELECT'), ('delete_requests', 'SELECT'), ('provider_journal', 'SELECT'))
       AS g(tbl, privileges)
 WHERE to_regclass(format('%I.%I', :'schema', g.tbl)) IS NOT NULL
\gexec
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, :'definer_role')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema' AND p.proname = 'oc_clock'
\gexec
