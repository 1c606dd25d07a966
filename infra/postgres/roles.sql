-- The ledger's database roles (docs/DATABASE.md explains every grant, role by role).
--
--   owner    runs `orphan-cleanup migrate` and the operator commands (backend add, run,
--            status ...): owns the product's tables, functions and triggers.
--   lister, classifier, deleter
--            one role per deployed function, each granted only what its function runs
--            (docs/DATABASE.md, "One role per function"; SAFETY.md rule 19): the lister
--            starts cycles and records listings, the classifier applies batches, the
--            deleter records deletions and gates. Each reads every table.
--   definer  NOLOGIN: owns the SECURITY DEFINER functions (search_path pinned) behind
--            writes that a function's own role may not make itself.
--   runtime  every function at once (one secret for all three, the fallback), and the
--            rights a manual `run` needs: the union of the three functions' grants
--            (function_roles.sql), and the cycle's deadline its heartbeat extends. Reads
--            every table; inserts into the product's own (never orphan_resources: only
--            the deleter's function does); updates only the columns the functions update;
--            deletes only delete gates; never updates or deletes the audit trail (events,
--            provider_journal, cycle_batches, orphan_resources: docs/SAFETY.md rule 19);
--            executes its functions; no DDL of any kind.
--
-- Run it with psql, as a superuser or the cloud's admin user (RDS master user, Cloud SQL
-- `postgres`), connected to the ledger's database: once before the first
-- `orphan-cleanup migrate`, and once after every migrate that ran migrations (it is
-- idempotent; the run after migrate grants the tables migrate created and takes back
-- what the default privileges gave the runtime role on the C1 tables and the log):
--
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f infra/postgres/roles.sql
--
-- psql variables (-v name=value), all optional:
--   owner_role        default orphan_cleanup_owner
--   runtime_role      default orphan_cleanup_runtime
--   lister_role       default orphan_cleanup_lister
--   classifier_role   default orphan_cleanup_classifier
--   deleter_role      default orphan_cleanup_deleter
--   definer_role      default orphan_cleanup_definer (NOLOGIN)
--   lister_password, classifier_password, deleter_password: as runtime_password
--   owner_password    set (or reset) that login password; without it a new role has
--   runtime_password  none: set it with psql's \password ROLE (it sends a hash only),
--                     or a client certificate (docs/DATABASE.md)
--   schema            default public: where migrate creates the tables
--                     (another name, e.g. orphan_cleanup, gives the ledger a schema of
--                     its own, created here and owned by the owner role when missing;
--                     every URL of the product then says
--                     options=-csearch_path%3Dorphan_cleanup: docs/DATABASE.md)
--   platform_role     the role the platform writes its ledger with: the migrations'
--                     triggers on the C1 tables insert into ledger_activity as that role
--   c1_owner          the role owning C1 tables that the platform created before the
--                     first migrate: the owner role becomes its member, as migrate indexes
--                     and puts triggers on them, which PostgreSQL allows only to the owner
--   revoke_public     on: revoke CREATE on the schema and TEMPORARY on the database from
--                     PUBLIC (the schema part is PostgreSQL 15's default), for every role
--                     that has no grant of its own

\set ON_ERROR_STOP on
\if :{?owner_role}
\else
\set owner_role orphan_cleanup_owner
\endif
\if :{?runtime_role}
\else
\set runtime_role orphan_cleanup_runtime
\endif
\if :{?lister_role}
\else
\set lister_role orphan_cleanup_lister
\endif
\if :{?classifier_role}
\else
\set classifier_role orphan_cleanup_classifier
\endif
\if :{?deleter_role}
\else
\set deleter_role orphan_cleanup_deleter
\endif
\if :{?definer_role}
\else
\set definer_role orphan_cleanup_definer
\endif
\if :{?schema}
\else
\set schema public
\endif
\if :{?revoke_public}
\else
\set revoke_public off
\endif

BEGIN;
SET LOCAL client_min_messages = warning;  -- not the NOTICEs of grants that already exist

SELECT current_database() AS dbname,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'owner_role') AS create_owner,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'runtime_role') AS create_runtime,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'lister_role') AS create_lister,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'classifier_role') AS create_classifier,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'deleter_role') AS create_deleter,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'definer_role') AS create_definer,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS is_superuser
\gset

-- ---- the roles ---------------------------------------------------------------------
\if :create_owner
CREATE ROLE :"owner_role";
\endif
\if :create_runtime
CREATE ROLE :"runtime_role";
\endif
\if :create_lister
CREATE ROLE :"lister_role";
\endif
\if :create_classifier
CREATE ROLE :"classifier_role";
\endif
\if :create_deleter
CREATE ROLE :"deleter_role";
\endif
\if :create_definer
CREATE ROLE :"definer_role";
\endif
ALTER ROLE :"owner_role" LOGIN INHERIT NOCREATEDB NOCREATEROLE;
-- NOINHERIT: a role granted to the runtime by mistake lends it none of its privileges.
ALTER ROLE :"runtime_role" LOGIN NOINHERIT NOCREATEDB NOCREATEROLE;
ALTER ROLE :"lister_role" LOGIN NOINHERIT NOCREATEDB NOCREATEROLE;
ALTER ROLE :"classifier_role" LOGIN NOINHERIT NOCREATEDB NOCREATEROLE;
ALTER ROLE :"deleter_role" LOGIN NOINHERIT NOCREATEDB NOCREATEROLE;
ALTER ROLE :"definer_role" NOLOGIN NOINHERIT NOCREATEDB NOCREATEROLE;
\if :is_superuser
ALTER ROLE :"owner_role" NOSUPERUSER NOREPLICATION NOBYPASSRLS;
ALTER ROLE :"runtime_role" NOSUPERUSER NOREPLICATION NOBYPASSRLS;
ALTER ROLE :"lister_role" NOSUPERUSER NOREPLICATION NOBYPASSRLS;
ALTER ROLE :"classifier_role" NOSUPERUSER NOREPLICATION NOBYPASSRLS;
ALTER ROLE :"deleter_role" NOSUPERUSER NOREPLICATION NOBYPASSRLS;
ALTER ROLE :"definer_role" NOSUPERUSER NOREPLICATION NOBYPASSRLS;
\else
-- ALTER DEFAULT PRIVILEGES FOR ROLE needs a member of that role; handing a function to
-- the definer role, a member of it.
GRANT :"owner_role" TO CURRENT_USER;
GRANT :"definer_role" TO CURRENT_USER;
\endif
-- migrate (as the owner) replaces and pins the definer's functions: it must act as their owner.
GRANT :"definer_role" TO :"owner_role";
\if :{?owner_password}
ALTER ROLE :"owner_role" PASSWORD :'owner_password';
\endif
\if :{?runtime_password}
ALTER ROLE :"runtime_role" PASSWORD :'runtime_password';
\endif
\if :{?lister_password}
ALTER ROLE :"lister_role" PASSWORD :'lister_password';
\endif
\if :{?classifier_password}
ALTER ROLE :"classifier_role" PASSWORD :'classifier_password';
\endif
\if :{?deleter_password}
ALTER ROLE :"deleter_role" PASSWORD :'deleter_password';
\endif

-- ---- a schema of its own ----------------------------------------------------------
-- A platform whose own tables are named backends or instances (dstack's are) keeps them
-- in public; the ledger goes to -v schema=orphan_cleanup, beside them, never into them.
SELECT NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = :'schema') AS create_schema
\gset
\if :create_schema
CREATE SCHEMA :"schema" AUTHORIZATION :"owner_role";
\endif

-- ---- database and schema -----------------------------------------------------------
REVOKE ALL ON DATABASE :"dbname" FROM :"runtime_role", :"lister_role", :"classifier_role", :"deleter_role",
    :"definer_role";
GRANT CONNECT ON DATABASE :"dbname" TO :"owner_role", :"runtime_role", :"lister_role", :"classifier_role",
    :"deleter_role";
GRANT USAGE ON SCHEMA :"schema" TO :"owner_role";
-- With grant option: migrate (as the owner) hands a SECURITY DEFINER function it created to
-- the definer, whose CREATE on the schema PostgreSQL requires meanwhile (grants.sql).
GRANT CREATE ON SCHEMA :"schema" TO :"owner_role" WITH GRANT OPTION;
REVOKE ALL ON SCHEMA :"schema" FROM :"runtime_role", :"lister_role", :"classifier_role", :"deleter_role",
    :"definer_role";
GRANT USAGE ON SCHEMA :"schema" TO :"runtime_role", :"lister_role", :"classifier_role", :"deleter_role",
    :"definer_role";
\if :revoke_public
REVOKE CREATE ON SCHEMA :"schema" FROM PUBLIC;
REVOKE TEMPORARY ON DATABASE :"dbname" FROM PUBLIC;
\endif

-- ---- C1 tables the platform created: the owner role must hold their owner's rights --
\if :{?c1_owner}
GRANT :"c1_owner" TO :"owner_role";
\endif
SELECT coalesce(bool_and(pg_has_role(:'owner_role', c.relowner, 'USAGE')), true) AS owner_may_migrate,
       string_agg(DISTINCT pg_get_userbyid(c.relowner), ', ') AS c1_owners
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relname IN ('backends', 'provider_refs', 'instances', 'volumes')
   AND c.relkind IN ('r', 'p')
\gset
\if :owner_may_migrate
\else
\echo roles.sql: the C1 tables are owned by :c1_owners; migrate as :owner_role would fail (must be owner of table instances).
\echo Rerun with -v c1_owner=ROLE, or ALTER TABLE ... OWNER TO :owner_role (see docs/DATABASE.md).
DO $$ BEGIN RAISE EXCEPTION 'roles.sql: the owner role neither owns the C1 tables nor is a member of their owner'; END $$;
\endif

-- ---- what each role may do with what migrations create -----------------------------
-- The grants, which `orphan-cleanup migrate` also applies after the migrations it runs
-- (as the owner role; docs/DATABASE.md, "4. Roles"): the runtime role's, each function's
-- role's (function_roles.sql) and the definer's.
\ir ../../shared/orphan_cleanup/ledger/grants.sql

-- ---- the platform's writer ---------------------------------------------------------
-- The triggers on the C1 tables run as whoever writes them and insert into
-- ledger_activity; on C1 tables the owner role owns (migrate created them), the
-- platform also needs its rights to write them.
\if :{?platform_role}
GRANT USAGE ON SCHEMA :"schema" TO :"platform_role";
SELECT format('GRANT INSERT ON TABLE %I.%I TO %I', n.nspname, c.relname, :'platform_role'),
       format('GRANT USAGE ON SEQUENCE %s TO %I', pg_get_serial_sequence(format('%I.%I', n.nspname, c.relname), 'id'),
              :'platform_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relname = 'ledger_activity' AND c.relkind IN ('r', 'p')
\gexec
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I.%I TO %I', n.nspname, c.relname, :'platform_role')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p')
   AND c.relname IN ('backends', 'provider_refs', 'instances', 'volumes')
   AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = :'owner_role')
\gexec
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, :'platform_role')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema' AND (p.proname LIKE 'orphan\_cleanup\_%' OR p.proname = 'oc_clock')
   AND p.proowner IN (SELECT oid FROM pg_roles WHERE rolname IN (:'owner_role', :'definer_role'))
\gexec
\endif

-- ---- checks ------------------------------------------------------------------------
SELECT has_schema_privilege(:'runtime_role', :'schema', 'CREATE')
       OR has_database_privilege(:'runtime_role', :'dbname', 'CREATE') AS runtime_may_create,
       has_database_privilege(:'runtime_role', :'dbname', 'TEMPORARY') AS runtime_may_create_temp,
       to_regclass(format('%I.%I', :'schema', 'ledger_activity')) IS NULL AS before_migrate
\gset
\if :runtime_may_create
\echo roles.sql: PUBLIC may CREATE in schema :schema or database :dbname (the default before PostgreSQL 15), so :runtime_role may too.
\echo Rerun with -v revoke_public=on, or REVOKE CREATE ON SCHEMA :schema FROM PUBLIC yourself.
DO $$ BEGIN RAISE EXCEPTION 'roles.sql: the runtime role would be allowed to create objects'; END $$;
\endif
\if :runtime_may_create_temp
\echo roles.sql: note: PUBLIC holds TEMPORARY on :dbname, so :runtime_role may create temporary tables (it never needs to); -v revoke_public=on revokes it.
\endif

COMMIT;

\if :before_migrate
\echo roles.sql: done; run orphan-cleanup migrate as :owner_role, then this script again to grant the tables it creates.
\else
\echo roles.sql: done.
\endif
