//! Read paths: reports, invoices, the platform view. Each checks the caller first.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{from_us, on_pool, to_us, Day, FleetUsage, Ledger};
use crate::access::Principal;
use crate::error::{Error, Result};
use crate::invoice::{build_invoice, Invoice, InvoiceLine, InvoiceStatus};
use crate::money::TokenKind;
use crate::period::{Month, Period};
use crate::platform::{build_platform_report, PlatformReport};
use crate::price::Prices;
use crate::report::{build_report, UsageReport, UsageRow};
use crate::usage::{CapacityType, Totals};

impl Ledger {
    /// Daily aggregate rows of one tenant (or, admin only, of all with `None`) in `period`.
    pub async fn usage_rows(
        &self,
        principal: &Principal,
        tenant: Option<&str>,
        period: Period,
    ) -> Result<Vec<UsageRow>> {
        match tenant {
            Some(t) => principal.authorize_tenant(t)?,
            None => principal.authorize_admin()?,
        }
        self.rows(tenant, period.from, period.until).await
    }

    /// Aggregate rows of one tenant (or all, with `None`) with `day` in `[from, until)`.
    async fn rows(&self, tenant: Option<&str>, from: Day, until: Day) -> Result<Vec<UsageRow>> {
        on_pool!(self, |pool, Db| {
            sqlx::query(
                "SELECT d.tenant_id, d.model_id, d.day, d.capacity, d.price_version_id, d.segments, \
                 d.input_tokens, d.cached_input_tokens, d.output_tokens, \
                 p.input_per_m, p.cached_input_per_m, p.output_per_m \
                 FROM daily_usage d LEFT JOIN price_versions p ON p.id = d.price_version_id \
                 WHERE ($1 IS NULL OR d.tenant_id = $1) AND d.day >= $2 AND d.day < $3 \
                 ORDER BY d.day, d.model_id",
            )
            .bind(tenant)
            .bind(from)
            .bind(until)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| -> Result<UsageRow> {
                Ok(UsageRow {
                    tenant: row.try_get("tenant_id")?,
                    model: row.try_get("model_id")?,
                    day: row.try_get("day")?,
                    capacity: CapacityType::parse(row.try_get("capacity")?)
                        .map_err(|e| Error::Corrupt(e.to_string()))?,
                    price_version_id: row.try_get("price_version_id")?,
                    prices: Prices {
                        input_per_m: row.try_get::<Option<i64>, _>("input_per_m")?.unwrap_or(0),
                        cached_input_per_m: row.try_get::<Option<i64>, _>("cached_input_per_m")?.unwrap_or(0),
                        output_per_m: row.try_get::<Option<i64>, _>("output_per_m")?.unwrap_or(0),
                    },
                    totals: Totals {
                        segments: row.try_get("segments")?,
                        input_tokens: row.try_get("input_tokens")?,
                        cached_input_tokens: row.try_get("cached_input_tokens")?,
                        output_tokens: row.try_get("output_tokens")?,
                    },
                })
            })
            .collect()
        })
    }

    /// `tenant`'s usage report over `period`: tokens and cost per model, per day.
    pub async fn report(
        &self,
        principal: &Principal,
        tenant: &str,
        period: Period,
    ) -> Result<UsageReport> {
        principal.authorize_tenant(tenant)?;
        let rows = self.rows(Some(tenant), period.from, period.until).await?;
        build_report(tenant, period, &rows)
    }

    /// The stored invoice of `tenant` for `month`, if issued.
    async fn issued_invoice(&self, tenant: &str, month: Month) -> Result<Option<Invoice>> {
        let stored = on_pool!(self, |pool, Db| {
            let head = sqlx::query(
                "SELECT id, issued_us, currency, total_micros FROM invoices WHERE tenant_id = $1 AND month = $2",
            )
            .bind(tenant)
            .bind(month.to_string())
            .fetch_optional(pool)
            .await?;
            match head {
                None => None,
                Some(head) => {
                    let id: String = head.try_get("id")?;
                    let lines = sqlx::query(
                        "SELECT service_month, model_id, price_version_id, kind, tokens, unit_price_per_m, \
                         amount_micros, adjustment FROM invoice_lines WHERE invoice_id = $1 ORDER BY line_no",
                    )
                    .bind(id.as_str())
                    .fetch_all(pool)
                    .await?
                    .iter()
                    .map(line_from_row)
                    .collect::<Result<Vec<_>>>()?;
                    Some((
                        id,
                        from_us(head.try_get("issued_us")?)?,
                        head.try_get::<String, _>("currency")?,
                        head.try_get::<i64, _>("total_micros")?,
                        lines,
                    ))
                }
            }
        });
        Ok(
            stored.map(|(id, issued_at, currency, total_micros, lines)| Invoice {
                id: Some(id),
                tenant: tenant.into(),
                month,
                status: InvoiceStatus::Issued,
                issued_at: Some(issued_at),
                currency,
                lines,
                total_micros,
                unpriced_tokens: 0,
            }),
        )
    }

    /// Every issued line of `tenant`, and the months issued.
    async fn billed_lines(&self, tenant: &str) -> Result<(Vec<InvoiceLine>, BTreeSet<Month>)> {
        on_pool!(self, |pool, Db| {
            let lines = sqlx::query(
                "SELECT l.service_month, l.model_id, l.price_version_id, l.kind, l.tokens, l.unit_price_per_m, \
                 l.amount_micros, l.adjustment FROM invoice_lines l JOIN invoices i ON i.id = l.invoice_id \
                 WHERE i.tenant_id = $1",
            )
            .bind(tenant)
            .fetch_all(pool)
            .await?
            .iter()
            .map(line_from_row)
            .collect::<Result<Vec<_>>>()?;
            let months = sqlx::query("SELECT month FROM invoices WHERE tenant_id = $1")
                .bind(tenant)
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| Month::parse(row.try_get("month")?))
                .collect::<Result<BTreeSet<_>>>()?;
            Ok::<_, Error>((lines, months))
        })
    }

    async fn draft_invoice(&self, tenant: &str, month: Month) -> Result<Invoice> {
        let (billed, issued) = self.billed_lines(tenant).await?;
        // Earlier issued months may need adjustments: read from the first of them.
        let from = issued
            .iter()
            .next()
            .copied()
            .filter(|m| *m < month)
            .unwrap_or(month)
            .first_day();
        let rows = self
            .rows(Some(tenant), from, month.next().first_day())
            .await?;
        build_invoice(tenant, month, &rows, &billed, &issued)
    }

    /// `tenant`'s invoice for `month`: the stored one once issued (it never changes), else a
    /// draft computed from current usage.
    pub async fn invoice(
        &self,
        principal: &Principal,
        tenant: &str,
        month: Month,
    ) -> Result<Invoice> {
        principal.authorize_tenant(tenant)?;
        if let Some(issued) = self.issued_invoice(tenant, month).await? {
            return Ok(issued);
        }
        self.draft_invoice(tenant, month).await
    }

    /// Issues (stores for good) `tenant`'s invoice for a month that is over at `now`.
    ///
    /// Idempotent: issuing again returns the stored invoice unchanged. Admin only.
    pub async fn issue_invoice(
        &self,
        principal: &Principal,
        tenant: &str,
        month: Month,
        now: DateTime<Utc>,
    ) -> Result<Invoice> {
        principal.authorize_admin()?;
        if !month.is_closed_at(now) {
            return Err(Error::MonthNotClosed(month.to_string()));
        }
        // Fails with NotFound for an unknown tenant (rather than a foreign-key error).
        self.tenant(principal, tenant).await?;
        if let Some(issued) = self.issued_invoice(tenant, month).await? {
            return Ok(issued);
        }
        let draft = self.draft_invoice(tenant, month).await?;
        if draft.unpriced_tokens > 0 {
            return Err(Error::Unpriced(format!(
                "{} tokens of {tenant:?} in {month} or earlier issued months",
                draft.unpriced_tokens
            )));
        }
        let id = uuid::Uuid::now_v7().to_string();
        on_pool!(self, |pool, Db| {
            let mut tx = pool.begin().await?;
            let inserted = sqlx::query(
                "INSERT INTO invoices (id, tenant_id, month, issued_us, currency, total_micros) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant_id, month) DO NOTHING",
            )
            .bind(id.as_str())
            .bind(tenant)
            .bind(month.to_string())
            .bind(to_us(now))
            .bind(draft.currency.as_str())
            .bind(draft.total_micros)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 1 {
                for (no, l) in draft.lines.iter().enumerate() {
                    sqlx::query(
                        "INSERT INTO invoice_lines (invoice_id, line_no, service_month, model_id, price_version_id, \
                         kind, tokens, unit_price_per_m, amount_micros, adjustment) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                    )
                    .bind(id.as_str())
                    .bind(no as i64)
                    .bind(l.service_month.to_string())
                    .bind(l.model.as_str())
                    .bind(l.price_version_id)
                    .bind(l.kind.as_str())
                    .bind(l.tokens)
                    .bind(l.unit_price_per_m)
                    .bind(l.amount_micros)
                    .bind(l.adjustment)
                    .execute(&mut *tx)
                    .await?;
                }
            }
            tx.commit().await?;
        });
        tracing::info!(tenant, %month, "invoice issued");
        // Read back what is stored (ours, or a concurrent issuer's).
        self.issued_invoice(tenant, month)
            .await?
            .ok_or_else(|| Error::Corrupt(format!("invoice {tenant}/{month} vanished after issue")))
    }

    /// Fleet usage rows with `day` in `period`.
    pub async fn fleet_usage(
        &self,
        principal: &Principal,
        period: Period,
    ) -> Result<Vec<FleetUsage>> {
        principal.authorize_admin()?;
        on_pool!(self, |pool, Db| {
            sqlx::query(
                "SELECT model_id, capacity, day, price_per_hour_micros, replica_ms FROM fleet_usage \
                 WHERE day >= $1 AND day < $2 ORDER BY model_id, day",
            )
            .bind(period.from)
            .bind(period.until)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| -> Result<FleetUsage> {
                Ok(FleetUsage {
                    model: row.try_get("model_id")?,
                    capacity: CapacityType::parse(row.try_get("capacity")?).map_err(|e| Error::Corrupt(e.to_string()))?,
                    day: row.try_get("day")?,
                    price_per_hour_micros: row.try_get("price_per_hour_micros")?,
                    replica_ms: row.try_get("replica_ms")?,
                })
            })
            .collect()
        })
    }

    /// The platform view over `period` (admin only).
    pub async fn platform_report(
        &self,
        principal: &Principal,
        period: Period,
    ) -> Result<PlatformReport> {
        principal.authorize_admin()?;
        let usage = self.rows(None, period.from, period.until).await?;
        let fleet = self.fleet_usage(principal, period).await?;
        build_platform_report(period, &usage, &fleet)
    }

    /// Number of stored usage events (all tenants; admin only). For checks and tests.
    pub async fn event_count(&self, principal: &Principal) -> Result<i64> {
        principal.authorize_admin()?;
        on_pool!(self, |pool, Db| {
            Ok(sqlx::query("SELECT COUNT(*) AS n FROM usage_events")
                .fetch_one(pool)
                .await?
                .try_get("n")?)
        })
    }
}

fn line_from_row<R>(row: &R) -> Result<InvoiceLine>
where
    R: Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> &'a str: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    i64: for<'a> sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    bool: for<'a> sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    Ok(InvoiceLine {
        service_month: Month::parse(row.try_get::<&str, _>("service_month")?)?,
        model: row.try_get::<&str, _>("model_id")?.to_string(),
        price_version_id: row.try_get("price_version_id")?,
        kind: TokenKind::parse(row.try_get::<&str, _>("kind")?)?,
        tokens: row.try_get("tokens")?,
        unit_price_per_m: row.try_get("unit_price_per_m")?,
        amount_micros: row.try_get("amount_micros")?,
        adjustment: row.try_get("adjustment")?,
    })
}
