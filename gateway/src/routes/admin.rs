//! The admin API (`/v1/admin/...`, `Authorization: Bearer <admin token>`): tenants, keys,
//! budgets and rate limits, all in the ledger. 403 when no admin token is configured, 401
//! for a missing or wrong token; the token is checked before the body is read.
//!
//! Bodies are JSON objects (anything else is a 400) of at most [`ADMIN_BODY_BYTES`]. Every
//! field of a `PUT` body is required: `null` is how a limit or the budget is removed, so an
//! empty or partial body removes nothing by accident. Integers may be written as integral
//! floats (`4390.0`), as the OpenAPI document's `integer` allows.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use tidal_billing::ledger::RateLimits;
use tidal_billing::{Principal, Role};
use tidal_protocol::error::parse_json;
use tidal_protocol::{number, ApiError};

use super::{read_body, ADMIN_BODY_BYTES};
use crate::auth;
use crate::error::Reject;
use crate::gateway::Shared;

type Result<T, E = Reject> = std::result::Result<T, E>;

fn path(p: Result<Path<String>, PathRejection>) -> Result<String> {
    p.map(|Path(s)| s)
        .map_err(|e| ApiError::bad_request(format!("bad path: {}", e.body_text())).into())
}

/// Reads the body (the caller checked the admin token) as a JSON object of type `T`.
async fn json_body<T: serde::de::DeserializeOwned>(
    shared: &Shared,
    headers: &HeaderMap,
    body: Body,
) -> Result<T> {
    let b = read_body(shared, headers, body, ADMIN_BODY_BYTES).await?;
    object(&b)
}

/// `b` as `T`, if it is a JSON object (serde would also take a struct from an array).
fn object<T: serde::de::DeserializeOwned>(b: &Bytes) -> Result<T> {
    let map: serde_json::Map<String, Value> = parse_json(b).map_err(|_| {
        ApiError::bad_request(match serde_json::from_slice::<Value>(b) {
            Ok(_) => "Invalid request body: expected a JSON object".to_owned(),
            Err(e) => format!("Invalid request body: {e}"),
        })
    })?;
    serde_json::from_value(Value::Object(map))
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")).into())
}

/// An optional field that, when present, must not be `null`.
fn not_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> std::result::Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

fn now(shared: &Shared) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(shared.now_ms() as i64).unwrap_or_else(chrono::Utc::now)
}

fn finish(r: Result<Response>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewTenant {
    id: String,
    #[serde(default, deserialize_with = "not_null")]
    name: Option<String>,
}

/// `POST /v1/admin/tenants` `{"id", "name"?}` → 201 with the tenant.
pub(super) async fn create_tenant(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let t: NewTenant = json_body(&shared, &headers, body).await?;
            let name = t.name.unwrap_or_else(|| t.id.clone());
            let tenant = shared
                .ledger
                .create_tenant(&t.id, &name, now(&shared))
                .await?;
            Ok((StatusCode::CREATED, Json(tenant)).into_response())
        }
        .await,
    )
}

/// `GET /v1/admin/tenants` → every tenant with budget and limits.
pub(super) async fn list_tenants(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let tenants = shared.ledger.tenant_settings().await?;
            Ok(Json(json!({"object": "list", "data": tenants})).into_response())
        }
        .await,
    )
}

/// `GET /v1/admin/tenants/{tenant}` → the tenant, its limits, budget status and keys.
pub(super) async fn show_tenant(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    tenant: Result<Path<String>, PathRejection>,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let tenant = path(tenant)?;
            let op = Principal::operator();
            let t = shared.ledger.tenant(&op, &tenant).await?;
            let limits = shared.ledger.rate_limits(&tenant).await?;
            let budget = shared
                .ledger
                .budget_status(&op, &tenant, now(&shared))
                .await?;
            let keys = shared.ledger.list_keys(&op, &tenant).await?;
            Ok(Json(json!({
                "tenant": t,
                "limits": limits,
                "budget": budget,
                "keys": keys,
            }))
            .into_response())
        }
        .await,
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewKey {
    #[serde(default, deserialize_with = "not_null")]
    role: Option<Role>,
}

/// `POST /v1/admin/tenants/{tenant}/keys` `{"role": "tenant"|"admin"}` (body optional) →
/// 201 with the key; its `secret` is shown this once.
pub(super) async fn issue_key(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    tenant: Result<Path<String>, PathRejection>,
    body: Body,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let tenant = path(tenant)?;
            let body = read_body(&shared, &headers, body, ADMIN_BODY_BYTES).await?;
            let req: NewKey = if body.iter().all(u8::is_ascii_whitespace) {
                NewKey::default()
            } else {
                object(&body)?
            };
            let key = shared
                .ledger
                .issue_key(&tenant, req.role.unwrap_or(Role::Tenant), now(&shared))
                .await?;
            Ok((StatusCode::CREATED, Json(key)).into_response())
        }
        .await,
    )
}

/// `DELETE /v1/admin/keys/{key_id}` → 200 `{"id", "revoked": true}`. Takes effect on this
/// gateway at once, on other replicas within their `cache_ttl`.
pub(super) async fn revoke_key(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    key_id: Result<Path<String>, PathRejection>,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let key_id = path(key_id)?;
            shared.ledger.revoke_key(&key_id, now(&shared)).await?;
            shared.keys.revoke(&key_id);
            Ok(Json(json!({"id": key_id, "revoked": true})).into_response())
        }
        .await,
    )
}

/// `PUT /v1/admin/tenants/{tenant}/limits` `{"requests_per_min": n|null,
/// "tokens_per_min": n|null}` (both required; null: unlimited) → the limits.
pub(super) async fn set_limits(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    tenant: Result<Path<String>, PathRejection>,
    body: Body,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let tenant = path(tenant)?;
            let limits: LimitsBody = json_body(&shared, &headers, body).await?;
            let limits = RateLimits {
                requests_per_min: limits.requests_per_min,
                tokens_per_min: limits.tokens_per_min,
            };
            shared.ledger.set_rate_limits(&tenant, limits).await?;
            shared.policies.remove(&tenant);
            Ok(Json(json!({"tenant": tenant, "limits": limits})).into_response())
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsBody {
    // Required (no `default`): `null` removes a limit, absence is a 400.
    #[serde(deserialize_with = "number::opt_int")]
    requests_per_min: Option<u64>,
    #[serde(deserialize_with = "number::opt_int")]
    tokens_per_min: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BudgetBody {
    // Required (no `default`): `null` removes the budget, absence is a 400.
    #[serde(deserialize_with = "number::opt_int")]
    monthly_budget_micros: Option<i64>,
}

/// `PUT /v1/admin/tenants/{tenant}/budget` `{"monthly_budget_micros": n|null}` (required;
/// null: unlimited, the only way to remove a budget) → the tenant's budget status.
pub(super) async fn set_budget(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    tenant: Result<Path<String>, PathRejection>,
    body: Body,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let tenant = path(tenant)?;
            let b: BudgetBody = json_body(&shared, &headers, body).await?;
            shared
                .ledger
                .set_budget(&tenant, b.monthly_budget_micros)
                .await?;
            shared.policies.remove(&tenant);
            let status = shared
                .ledger
                .budget_status(&Principal::operator(), &tenant, now(&shared))
                .await?;
            Ok(Json(json!({"tenant": tenant, "budget": status})).into_response())
        }
        .await,
    )
}
