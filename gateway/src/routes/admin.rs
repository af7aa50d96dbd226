//! The admin API (`/v1/admin/...`, `Authorization: Bearer <admin token>`): tenants, keys,
//! budgets and rate limits, all in the ledger. 403 when no admin token is configured, 401
//! for a missing or wrong token.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use tidal_billing::ledger::RateLimits;
use tidal_billing::{Principal, Role};
use tidal_protocol::error::parse_json;
use tidal_protocol::ApiError;

use super::body_error;
use crate::auth;
use crate::error::Reject;
use crate::gateway::Shared;

type Result<T, E = Reject> = std::result::Result<T, E>;

fn path(p: Result<Path<String>, PathRejection>) -> Result<String> {
    p.map(|Path(s)| s)
        .map_err(|e| ApiError::bad_request(format!("bad path: {}", e.body_text())).into())
}

fn json_body<T: serde::de::DeserializeOwned>(b: Result<Bytes, BytesRejection>) -> Result<T> {
    let b = b.map_err(body_error)?;
    Ok(parse_json(&b)?)
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
    #[serde(default)]
    name: Option<String>,
}

/// `POST /v1/admin/tenants` `{"id", "name"?}` → 201 with the tenant.
pub(super) async fn create_tenant(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let t: NewTenant = json_body(body)?;
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
    #[serde(default)]
    role: Option<Role>,
}

/// `POST /v1/admin/tenants/{tenant}/keys` `{"role": "tenant"|"admin"}` (body optional) →
/// 201 with the key; its `secret` is shown this once.
pub(super) async fn issue_key(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    tenant: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let tenant = path(tenant)?;
            let body = body.map_err(body_error)?;
            let req: NewKey = if body.iter().all(u8::is_ascii_whitespace) {
                NewKey::default()
            } else {
                parse_json(&body)?
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
            shared.keys.clear();
            Ok(Json(json!({"id": key_id, "revoked": true})).into_response())
        }
        .await,
    )
}

/// `PUT /v1/admin/tenants/{tenant}/limits` `{"requests_per_min": n|null,
/// "tokens_per_min": n|null}` (null or absent: unlimited) → the limits.
pub(super) async fn set_limits(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    tenant: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let tenant = path(tenant)?;
            let limits: LimitsBody = json_body(body)?;
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
    #[serde(default)]
    requests_per_min: Option<u64>,
    #[serde(default)]
    tokens_per_min: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BudgetBody {
    monthly_budget_micros: Option<i64>,
}

/// `PUT /v1/admin/tenants/{tenant}/budget` `{"monthly_budget_micros": n|null}` (null:
/// unlimited) → the tenant's budget status.
pub(super) async fn set_budget(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    tenant: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    finish(
        async {
            auth::admin(&shared, &headers)?;
            let tenant = path(tenant)?;
            let b: BudgetBody = json_body(body)?;
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
