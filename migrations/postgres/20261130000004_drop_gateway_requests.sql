-- Request ownership moved to the broker (a record beside each request's response stream, with
-- the same expiry): the gateway no longer writes a database row per request.
DROP INDEX IF EXISTS gateway_requests_created;
DROP TABLE IF EXISTS gateway_requests;
