-- The product's own tables: per-backend cleanup state, cycles, orphans, events.

CREATE TABLE IF NOT EXISTS cleanup (
    backend_id          text PRIMARY KEY REFERENCES backends (id) ON DELETE CASCADE,
    clean_at            timestamptz NULL,
    clean_mode          text NULL,          -- mode of the last clean cycle
    last_processed_at   timestamptz NULL,
    next_due_at         timestamptz NOT NULL DEFAULT now(),
    retry_delay_seconds integer NOT NULL DEFAULT 0,
    last_outcome        text NULL CHECK (last_outcome IS NULL OR last_outcome IN ('clean', 'unsettled', 'failed')),
    last_error          text NULL,
    fence               bigint NOT NULL DEFAULT 0,
    lease_owner         text NULL,          -- cycle id holding the lease
    lease_expires_at    timestamptz NULL,
    created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS cycles (
    id               text PRIMARY KEY,
    backend_id       text NOT NULL REFERENCES backends (id) ON DELETE CASCADE,
    fence            bigint NOT NULL,
    mode             text NOT NULL,
    started_at       timestamptz NOT NULL DEFAULT now(),
    listed_at        timestamptz NULL,
    deadline         timestamptz NOT NULL,
    expected_batches integer NULL,
    applied_batches  integer NOT NULL DEFAULT 0,
    groups_listed    integer NOT NULL DEFAULT 0,
    open_deletes     integer NOT NULL DEFAULT 0,
    planned_deletes  integer NOT NULL DEFAULT 0,
    failures         jsonb NOT NULL DEFAULT '[]'::jsonb,
    unsettled        boolean NOT NULL DEFAULT false,
    failed           boolean NOT NULL DEFAULT false,
    error            text NULL,
    tripped_regions  text[] NOT NULL DEFAULT '{}',
    outcome          text NULL CHECK (outcome IS NULL OR outcome IN ('clean', 'unsettled', 'failed')),
    finished_at      timestamptz NULL
);
CREATE INDEX IF NOT EXISTS cycles_backend_idx ON cycles (backend_id, started_at DESC);

-- Idempotency of batch delivery: a redelivered (cycle, seq) inserts nothing.
CREATE TABLE IF NOT EXISTS cycle_batches (
    cycle_id   text NOT NULL REFERENCES cycles (id) ON DELETE CASCADE,
    seq        integer NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cycle_id, seq)
);

-- Groups that need a decision recorded (everything but tracked and ignored).
CREATE TABLE IF NOT EXISTS cycle_groups (
    cycle_id     text NOT NULL REFERENCES cycles (id) ON DELETE CASCADE,
    group_key    text NOT NULL,
    provider_ref text NOT NULL,
    region       text NOT NULL,
    primary_id   text NULL,
    resources    jsonb NOT NULL,
    verdict      text NOT NULL,
    reason       text NOT NULL,
    action       text NOT NULL DEFAULT 'none',
    error        text NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cycle_id, group_key)
);

CREATE TABLE IF NOT EXISTS orphans (
    backend_id     text NOT NULL REFERENCES backends (id) ON DELETE CASCADE,
    group_key      text NOT NULL,
    provider_ref   text NOT NULL,
    region         text NOT NULL,
    primary_id     text NULL,
    resources      jsonb NOT NULL,
    verdict        text NOT NULL DEFAULT 'orphan',
    reason         text NOT NULL,
    state          text NOT NULL DEFAULT 'open'
                   CHECK (state IN ('open', 'deleting', 'deleted', 'delete_failed', 'protected')),
    owner_id       text NULL,
    owner_name     text NULL,
    first_seen     timestamptz NOT NULL DEFAULT now(),
    last_seen      timestamptz NOT NULL DEFAULT now(),
    times_reported integer NOT NULL DEFAULT 0,
    last_cycle_id  text NULL,
    last_error     text NULL,
    PRIMARY KEY (backend_id, group_key)
);
CREATE INDEX IF NOT EXISTS orphans_ref_idx ON orphans (backend_id, provider_ref);

-- Resource ids once seen in an orphan group: their leftovers stay orphans
-- even while a (copied) owner of the same ref is live.
CREATE TABLE IF NOT EXISTS orphan_resources (
    backend_id   text NOT NULL REFERENCES backends (id) ON DELETE CASCADE,
    provider_ref text NOT NULL,
    resource_id  text NOT NULL,
    first_seen   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (backend_id, provider_ref, resource_id)
);

-- Per-ref delete gate (SAFETY.md rule 4): a lease row, never a global lock.
CREATE TABLE IF NOT EXISTS delete_gates (
    backend_id   text NOT NULL,
    provider_ref text NOT NULL,
    holder       text NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (backend_id, provider_ref)
);

-- Delete requests of a cycle: keyed by (cycle, group) so redelivery is a no-op.
CREATE TABLE IF NOT EXISTS delete_requests (
    cycle_id    text NOT NULL REFERENCES cycles (id) ON DELETE CASCADE,
    group_key   text NOT NULL,
    state       text NOT NULL DEFAULT 'queued'
                CHECK (state IN ('queued', 'done', 'deleting', 'failed', 'skipped')),
    attempts    integer NOT NULL DEFAULT 0,
    result      jsonb NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cycle_id, group_key)
);

CREATE TABLE IF NOT EXISTS events (
    id           bigserial PRIMARY KEY,
    backend_id   text NOT NULL,
    cycle_id     text NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    kind         text NOT NULL,
    message      text NOT NULL,
    provider_ref text NULL,
    owner_type   text NULL,
    owner_id     text NULL,
    owner_name   text NULL,
    details      jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS events_owner_idx ON events (owner_id, at);
CREATE INDEX IF NOT EXISTS events_backend_idx ON events (backend_id, at);
