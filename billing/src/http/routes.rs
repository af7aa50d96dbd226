//! The router and its handlers.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;

use super::auth::authenticate;
use super::error::HttpError;
use super::params::{parse_format, parse_month, target_tenant};
use crate::ledger::Ledger;
use crate::{invoice, platform, Format};

/// Query parameters every route accepts (unknown ones are ignored).
#[derive(Debug, Default, Deserialize)]
struct ReadQuery {
    month: Option<String>,
    tenant: Option<String>,
    format: Option<String>,
}

/// The usage API's routes over `ledger` (see the module docs); merge `/metrics` yourself.
pub fn router(ledger: Ledger) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/usage", get(usage))
        .route("/v1/invoices/{month}", get(invoice_route))
        .route("/v1/admin/platform", get(platform_route))
        .with_state(ledger)
}

async fn health() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

fn query(q: Result<Query<ReadQuery>, QueryRejection>) -> Result<ReadQuery, HttpError> {
    q.map(|Query(q)| q).map_err(|e| {
        HttpError(tidal_protocol::ApiError::bad_request(format!(
            "bad query string: {e}"
        )))
    })
}

fn rendered(format: Format, body: String) -> Response {
    let ct = match format {
        Format::Json => "application/json",
        Format::Csv => "text/csv; charset=utf-8",
    };
    ([(header::CONTENT_TYPE, HeaderValue::from_static(ct))], body).into_response()
}

fn finish(route: &'static str, r: Result<Response, HttpError>) -> Response {
    let resp = r.unwrap_or_else(IntoResponse::into_response);
    metrics::counter!("tidal_billing_http_requests_total", "route" => route, "status" => resp.status().as_str().to_owned())
        .increment(1);
    resp
}

async fn usage(
    State(ledger): State<Ledger>,
    headers: HeaderMap,
    q: Result<Query<ReadQuery>, QueryRejection>,
) -> Response {
    let r = async {
        let principal = authenticate(&ledger, &headers).await?;
        let q = query(q)?;
        let tenant = target_tenant(&principal, q.tenant.as_deref())?;
        let month = parse_month(q.month.as_deref())?;
        let format = parse_format(q.format.as_deref())?;
        let text = crate::report(&ledger, &principal, &tenant, month, format).await?;
        Ok(rendered(format, text))
    };
    finish("usage", r.await)
}

async fn invoice_route(
    State(ledger): State<Ledger>,
    headers: HeaderMap,
    Path(month): Path<String>,
    q: Result<Query<ReadQuery>, QueryRejection>,
) -> Response {
    let r = async {
        let principal = authenticate(&ledger, &headers).await?;
        let q = query(q)?;
        let tenant = target_tenant(&principal, q.tenant.as_deref())?;
        let month = parse_month(Some(&month))?;
        let format = parse_format(q.format.as_deref())?;
        let inv = ledger.invoice(&principal, &tenant, month).await?;
        let text = match format {
            Format::Json => invoice::render_json(&inv)?,
            Format::Csv => invoice::render_csv(&inv)?,
        };
        Ok(rendered(format, text))
    };
    finish("invoice", r.await)
}

async fn platform_route(
    State(ledger): State<Ledger>,
    headers: HeaderMap,
    q: Result<Query<ReadQuery>, QueryRejection>,
) -> Response {
    let r = async {
        let principal = authenticate(&ledger, &headers).await?;
        principal.authorize_admin()?;
        let q = query(q)?;
        let month = parse_month(q.month.as_deref())?;
        if parse_format(q.format.as_deref())? == Format::Csv {
            return Err(HttpError::invalid(
                "format",
                "the platform view is JSON only",
            ));
        }
        let view: platform::PlatformReport =
            ledger.platform_report(&principal, month.period()).await?;
        let text = serde_json::to_string_pretty(&view)
            .map_err(|e| HttpError(tidal_protocol::ApiError::internal(e.to_string())))?;
        Ok(rendered(Format::Json, text))
    };
    finish("platform", r.await)
}
