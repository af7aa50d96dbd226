-- Budget holds: what an admitted request of a tenant with a budget may still cost. Admission
-- checks spend + open holds + the new request's worst case against the budget in one
-- transaction and stores the hold; ingest counts the request's billed cost against it, and the
-- gateway lowers it to the request's real cost when the request ends. A hold counts
-- max(0, held - ingested) until it expires.
CREATE TABLE budget_holds (
    request_id    TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    month         TEXT NOT NULL,
    held_pico     BIGINT NOT NULL CHECK (held_pico >= 0),
    ingested_pico BIGINT NOT NULL DEFAULT 0,
    expires_us    BIGINT NOT NULL
);
CREATE INDEX budget_holds_tenant ON budget_holds (tenant_id, month);
