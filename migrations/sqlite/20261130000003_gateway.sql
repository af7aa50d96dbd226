-- Gateway admission data: per-tenant rate limits, and which tenant owns each request id so a
-- client can reattach to its response stream through any gateway replica, after a restart too.

-- Per-tenant rate limits; no row (or NULL) means unlimited. Counters live in Redis (or in
-- process for `tidal up`); only the configured limits are stored here.
CREATE TABLE tenant_rate_limits (
    tenant_id        TEXT PRIMARY KEY REFERENCES tenants (id),
    requests_per_min BIGINT NULL CHECK (requests_per_min > 0),
    tokens_per_min   BIGINT NULL CHECK (tokens_per_min > 0)
);

-- One row per accepted request until it is delivered, cancelled or pruned.
CREATE TABLE gateway_requests (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    model_id      TEXT NOT NULL,
    -- Entry id in the model's jobs stream (to withdraw it).
    entry_id      TEXT NOT NULL,
    endpoint      TEXT NOT NULL CHECK (endpoint IN ('chat', 'completion')),
    include_usage BOOLEAN NOT NULL,
    -- Instant (ms since the epoch) after which an unstarted job never runs.
    deadline_ms   BIGINT NOT NULL,
    created_us    BIGINT NOT NULL
);
CREATE INDEX gateway_requests_created ON gateway_requests (created_us);
