-- Tidal billing ledger (PostgreSQL). Money is integer micro-units; exact running spend is in
-- pico-units (10^-12). Instants are BIGINT microseconds since the Unix epoch (UTC), the same
-- representation as the SQLite schema, so both backends share one code path.

CREATE TABLE tenants (
    id                    TEXT PRIMARY KEY,
    name                  TEXT NOT NULL,
    created_us            BIGINT NOT NULL,
    -- Monthly spend limit in micro-units; NULL means unlimited.
    monthly_budget_micros BIGINT NULL CHECK (monthly_budget_micros >= 0)
);

CREATE TABLE api_keys (
    id         TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL REFERENCES tenants (id),
    prefix     TEXT NOT NULL,
    key_hash   BYTEA NOT NULL UNIQUE,
    role       TEXT NOT NULL CHECK (role IN ('tenant', 'admin')),
    created_us BIGINT NOT NULL,
    revoked_us BIGINT NULL
);
CREATE INDEX api_keys_prefix ON api_keys (prefix);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE models (
    id         TEXT PRIMARY KEY,
    created_us BIGINT NOT NULL
);

-- Immutable price versions; id 0 is reserved for "no price in effect".
CREATE TABLE price_versions (
    id                 BIGSERIAL PRIMARY KEY CHECK (id > 0),
    model_id           TEXT NOT NULL REFERENCES models (id),
    effective_from_us  BIGINT NOT NULL,
    input_per_m        BIGINT NOT NULL CHECK (input_per_m >= 0),
    cached_input_per_m BIGINT NOT NULL CHECK (cached_input_per_m >= 0),
    output_per_m       BIGINT NOT NULL CHECK (output_per_m >= 0),
    created_us         BIGINT NOT NULL,
    UNIQUE (model_id, effective_from_us)
);

-- One row per (request, segment): the idempotency key of the usage stream.
CREATE TABLE usage_events (
    request_id           TEXT NOT NULL,
    segment              BIGINT NOT NULL,
    tenant_id            TEXT NOT NULL,
    model_id             TEXT NOT NULL,
    prompt_tokens        BIGINT NOT NULL,
    cached_prompt_tokens BIGINT NOT NULL,
    completion_tokens    BIGINT NOT NULL,
    worker               TEXT NOT NULL,
    capacity             TEXT NOT NULL,
    started_us           BIGINT NOT NULL,
    ended_us             BIGINT NOT NULL,
    day                  DATE NOT NULL,
    price_version_id     BIGINT NOT NULL,
    recorded_us          BIGINT NOT NULL,
    PRIMARY KEY (request_id, segment)
);
CREATE INDEX usage_events_tenant_day ON usage_events (tenant_id, day);

-- Events that failed validation: kept (nothing is lost), never billed.
CREATE TABLE usage_rejects (
    request_id  TEXT NOT NULL,
    segment     BIGINT NOT NULL,
    reason      TEXT NOT NULL,
    payload     TEXT NOT NULL,
    recorded_us BIGINT NOT NULL,
    PRIMARY KEY (request_id, segment)
);

CREATE TABLE daily_usage (
    tenant_id           TEXT NOT NULL,
    model_id            TEXT NOT NULL,
    day                 DATE NOT NULL,
    capacity            TEXT NOT NULL,
    price_version_id    BIGINT NOT NULL,
    segments            BIGINT NOT NULL,
    input_tokens        BIGINT NOT NULL,
    cached_input_tokens BIGINT NOT NULL,
    output_tokens       BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, model_id, day, capacity, price_version_id)
);
CREATE INDEX daily_usage_day ON daily_usage (day);

-- Running spend per tenant and month (YYYY-MM), exact, updated in the ingest transaction.
CREATE TABLE tenant_spend (
    tenant_id  TEXT NOT NULL,
    month      TEXT NOT NULL,
    spent_pico BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, month)
);

CREATE TABLE invoices (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL REFERENCES tenants (id),
    month        TEXT NOT NULL,
    issued_us    BIGINT NOT NULL,
    currency     TEXT NOT NULL,
    total_micros BIGINT NOT NULL,
    UNIQUE (tenant_id, month)
);

CREATE TABLE invoice_lines (
    invoice_id       TEXT NOT NULL REFERENCES invoices (id),
    line_no          BIGINT NOT NULL,
    service_month    TEXT NOT NULL,
    model_id         TEXT NOT NULL,
    price_version_id BIGINT NOT NULL,
    kind             TEXT NOT NULL,
    tokens           BIGINT NOT NULL,
    unit_price_per_m BIGINT NOT NULL,
    amount_micros    BIGINT NOT NULL,
    adjustment       BOOLEAN NOT NULL,
    PRIMARY KEY (invoice_id, line_no)
);

-- Fleet time recorded by the controller, with the hourly price it paid.
CREATE TABLE fleet_usage (
    model_id              TEXT NOT NULL,
    capacity              TEXT NOT NULL,
    day                   DATE NOT NULL,
    price_per_hour_micros BIGINT NOT NULL CHECK (price_per_hour_micros >= 0),
    replica_ms            BIGINT NOT NULL,
    PRIMARY KEY (model_id, capacity, day, price_per_hour_micros)
);
