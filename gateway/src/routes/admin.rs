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
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use tidal_billing::ledger::{RateLimits, TenantSettings};
use tidal_billing::{BudgetStatus, KeyInfo, Principal, Role, Tenant};
use tidal_protocol::error::parse_json;
use tidal_protocol::number::{self, Int, Nullable};
use tidal_protocol::ApiError;

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

/// A tenant id as the ledger takes it (`validate_tenant_id` there).
pub(crate) const TENANT_ID_PATTERN: &str = "^[a-z0-9][a-z0-9_-]{0,63}$";

/// A tenant name as the ledger takes it (`validate_tenant_name` there): no control character
/// (C0, DEL, C1), line or paragraph separator, or bidirectional override.
const TENANT_NAME_PATTERN: &str =
    "^[^\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]+$";

/// `POST /v1/admin/tenants`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewTenant {
    /// Lowercase letters, digits, `-` and `_`, starting with a letter or digit; at most 64.
    #[schemars(pattern(TENANT_ID_PATTERN))]
    id: String,
    /// Display name (default: the id): 1 to 128 characters, none a control character, line
    /// or paragraph separator, or bidirectional override.
    #[serde(default, deserialize_with = "not_null")]
    #[schemars(
        with = "String",
        length(min = 1, max = 128),
        pattern(TENANT_NAME_PATTERN)
    )]
    name: Option<String>,
}

/// `GET /v1/admin/tenants`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct TenantList {
    /// Always `list`.
    #[schemars(extend("const" = "list"))]
    object: &'static str,
    /// Every tenant, by id.
    data: Vec<TenantSettings>,
}

/// `GET /v1/admin/tenants/{tenant}`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct TenantView {
    tenant: Tenant,
    limits: RateLimits,
    /// This month's.
    budget: BudgetStatus,
    /// Every key, revoked ones too.
    keys: Vec<KeyInfo>,
}

/// `PUT /v1/admin/tenants/{tenant}/limits`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct TenantLimits {
    tenant: String,
    limits: RateLimits,
}

/// `PUT /v1/admin/tenants/{tenant}/budget`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct TenantBudget {
    tenant: String,
    /// This month's, under the new budget.
    budget: BudgetStatus,
}

/// `DELETE /v1/admin/keys/{key_id}`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct RevokedKey {
    id: String,
    #[schemars(extend("const" = true))]
    revoked: bool,
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
            let data = shared.ledger.tenant_settings().await?;
            Ok(Json(TenantList {
                object: "list",
                data,
            })
            .into_response())
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
            Ok(Json(TenantView {
                tenant: t,
                limits,
                budget,
                keys,
            })
            .into_response())
        }
        .await,
    )
}

/// `POST /v1/admin/tenants/{tenant}/keys` (the body is optional).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewKey {
    /// `tenant` when the body or the field is absent; `null` is a 400.
    #[serde(default, deserialize_with = "not_null")]
    #[schemars(with = "Role", extend("default" = "tenant"))]
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
            Ok(Json(RevokedKey {
                id: key_id,
                revoked: true,
            })
            .into_response())
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
            Ok(Json(TenantLimits { tenant, limits }).into_response())
        }
        .await,
    )
}

/// `PUT /v1/admin/tenants/{tenant}/limits`. Both fields are required: `null` removes a
/// limit, absence is a 400. The ledger keeps limits as signed 64-bit integers.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LimitsBody {
    /// Requests per minute; `null`: unlimited.
    #[serde(deserialize_with = "number::opt_int")]
    #[schemars(with = "Nullable<Int<u64>>", range(min = 1, max = i64::MAX))]
    requests_per_min: Option<u64>,
    /// Tokens per minute; `null`: unlimited.
    #[serde(deserialize_with = "number::opt_int")]
    #[schemars(with = "Nullable<Int<u64>>", range(min = 1, max = i64::MAX))]
    tokens_per_min: Option<u64>,
}

/// `PUT /v1/admin/tenants/{tenant}/budget`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BudgetBody {
    /// Monthly spend limit in micro-units of the currency. Required: `null` removes the
    /// budget (unlimited); an empty body is a 400.
    #[serde(deserialize_with = "number::opt_int")]
    #[schemars(with = "Nullable<Int<i64>>", range(min = 0))]
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
            Ok(Json(TenantBudget {
                tenant,
                budget: status,
            })
            .into_response())
        }
        .await,
    )
}
