-- What every role of infra/postgres/roles.sql may do with the tables, sequences and functions
-- migrations create: the runtime role's grants here, each function's role's in
-- function_roles.sql (included below), the definer's SECURITY DEFINER functions.
-- docs/DATABASE.md, "4. Roles", explains every grant.
--
-- Run twice, by two callers, with the same variables:
--   roles.sql includes it (\ir), inside its transaction, with its psql variables;
--   `orphan-cleanup migrate` runs it, as the owner role, in the transaction of the migrations
--   it applies (ledger/grants.py reads the same psql subset: `:'name'` a literal, `:"name"`
--   an identifier, `\gexec`, `\ir`; nothing else), so an upgrade needs no roles.sql run.
-- Every statement must therefore be one the owner role may run: it owns the product's tables
-- and functions, is a member of the definer (the SECURITY DEFINER functions' owner) and of
-- the C1 tables' owner (roles.sql's -v c1_owner). Variables: owner_role, runtime_role,
-- lister_role, classifier_role, deleter_role, definer_role, schema.

-- ---- tables, sequences and functions migrate will create --------------------------
-- A table a later migration creates is born readable only (a new audit table must not be
-- born mutable): the run of this script after that migrate grants each role what the
-- lists below give it. Functions are born executable by nobody but their owner.
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
    REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON TABLES FROM :"runtime_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
    GRANT SELECT ON TABLES TO :"runtime_role", :"lister_role", :"classifier_role", :"deleter_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
    REVOKE USAGE, SELECT ON SEQUENCES FROM :"runtime_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
    REVOKE EXECUTE ON FUNCTIONS FROM :"runtime_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- ---- tables, sequences and functions migrate created -------------------------------
-- The product's tables: read and insert (but orphan_resources: only through the deleter's
-- function); update only the columns the functions' statements update (the union of the
-- three functions' lists in function_roles.sql, and the cycle's deadline a manual run's
-- heartbeat extends); delete only a released delete gate and a mark a listing ended (rule 23). The audit trail (events,
-- provider_journal, and the batches and orphan resources a cycle saw) is append-only. Read
-- only: the C1 tables (the platform's), the activity log (written by the triggers; deleting
-- from it could hide activity from STEP 1) and schema_migrations (migrate's).
SELECT format('REVOKE ALL ON TABLE %I.%I FROM %I', n.nspname, c.relname, :'runtime_role'),
       format('GRANT SELECT ON TABLE %I.%I TO %I', n.nspname, c.relname, :'runtime_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p')
   AND (c.relowner = (SELECT oid FROM pg_roles WHERE rolname = :'owner_role')
        OR c.relname IN ('backends', 'provider_refs', 'instances', 'volumes'))
\gexec
SELECT format('GRANT INSERT ON TABLE %I.%I TO %I', n.nspname, c.relname, :'runtime_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p')
   AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = :'owner_role')
   AND c.relname IN ('cleanup', 'cycles', 'cycle_batches', 'cycle_groups', 'orphans', 'delete_requests',
                     'delete_gates', 'events', 'region_listings', 'orphan_marks')
\gexec
-- Of a cycle, only its progress changes: never its backend, fence, mode or snapshot
-- (docs/SAFETY.md rule 18). Of a group, an orphan and a request, only what a deletion
-- records: never their cycle, key, ref or resources. Of the lease row, never its backend.
SELECT format('GRANT UPDATE (%s) ON TABLE %I.%I TO %I', g.cols, n.nspname, c.relname, :'runtime_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN (VALUES
    ('cleanup', 'fence, lease_owner, lease_expires_at, clean_at, clean_mode, last_processed_at, next_due_at,'
                ' retry_delay_seconds, last_outcome, last_error'),
    ('cycles', 'listed_at, deadline, expected_batches, applied_batches, groups_listed, open_deletes,'
               ' planned_deletes, failures, unsettled, failed, error, tripped_regions, outcome, finished_at,'
               ' dispatched, blocked_reason, region_groups, origin_seen'),
    ('cycle_groups', 'action, error, updated_at, evidence, verdict, reason, delete_after'),
    ('orphans', 'last_seen, resources, verdict, reason, times_reported, last_cycle_id, state, last_error,'
                ' orphan_since, size, deleted_at'),
    ('orphan_marks', 'reason, member_ids, marked_at, cycle_id'),
    ('delete_requests', 'state, attempts, result, updated_at'),
    ('delete_gates', 'holder, expires_at'),
    ('region_listings', 'suspect_groups, suspect_at')
  ) AS g(tbl, cols) ON g.tbl = c.relname
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p')
   AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = :'owner_role')
\gexec
-- A journal row's id and time are the database's: the runtime inserts the other columns only.
SELECT format('GRANT INSERT (backend_id, cycle_id, scope, region, provider_ref, group_key, phase, intent_id, call,'
              ' target, blast, outcome, error) ON TABLE %I.%I TO %I', n.nspname, c.relname, :'runtime_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p')
   AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = :'owner_role')
   AND c.relname = 'provider_journal'
\gexec
SELECT format('GRANT DELETE ON TABLE %I.%I TO %I', n.nspname, c.relname, :'runtime_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p')
   AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = :'owner_role')
   AND c.relname IN ('delete_gates', 'orphan_marks')
\gexec
-- The ids of the rows it inserts: events and journal rows (none of the activity log's).
SELECT format('REVOKE ALL ON SEQUENCE %I.%I FROM %I', n.nspname, c.relname, :'runtime_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind = 'S'
\gexec
SELECT format('GRANT USAGE, SELECT ON SEQUENCE %s TO %I', pg_get_serial_sequence(format('%I.%I', :'schema', t), 'id'),
              :'runtime_role')
  FROM unnest(ARRAY['events', 'provider_journal']) AS t
 WHERE to_regclass(format('%I.%I', :'schema', t)) IS NOT NULL
   AND pg_get_serial_sequence(format('%I.%I', :'schema', t), 'id') IS NOT NULL
\gexec
-- PUBLIC executes none of them but the database clock (oc_clock: any reader reads its time)
-- and coverages() (what backends and retired_coverages hold, read with the caller's rights).
SELECT format(CASE WHEN p.proname IN ('oc_clock', 'coverages') THEN 'GRANT EXECUTE ON FUNCTION %s TO PUBLIC'
                   ELSE 'REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC' END, p.oid::regprocedure),
       format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, :'runtime_role')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema'
   AND p.proowner IN (SELECT oid FROM pg_roles WHERE rolname IN (:'owner_role', :'definer_role'))
\gexec

\ir function_roles.sql
