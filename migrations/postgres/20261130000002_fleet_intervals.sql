-- Each fleet interval the controller reports, once (its id is the idempotency key).
CREATE TABLE fleet_intervals (
    id                    TEXT PRIMARY KEY,
    model_id              TEXT NOT NULL,
    capacity              TEXT NOT NULL,
    day                   DATE NOT NULL,
    price_per_hour_micros BIGINT NOT NULL,
    replica_ms            BIGINT NOT NULL
);
