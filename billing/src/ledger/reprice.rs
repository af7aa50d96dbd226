//! Pricing usage that arrived before its model had a price.
//!
//! Such events are stored and aggregated under price version 0 (nothing is lost). When a
//! version that covers them is added, they move, in one transaction, from version 0 to the
//! version in effect at their end time: the events are relabelled, their totals move between
//! the daily rows, and their cost is added to tenant spend. Events already priced are never
//! repriced (versions are immutable).

use std::collections::BTreeSet;

use serde::Serialize;
use sqlx::{QueryBuilder, Row};

use super::ingest::{apply_deltas, load_versions, AGG_CHUNK};
use super::{from_us, on_pool, Ledger};
use crate::error::{Error, Result};
use crate::price::{PriceVersion, Prices, UNPRICED};
use crate::usage::{aggregate, price_records, CapacityType, Deltas, Totals, UsageRecord};

/// What [`Ledger::reprice_unpriced`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RepriceOutcome {
    /// Unpriced events found.
    pub unpriced: usize,
    /// Of those, events that now have a price and were moved to it.
    pub priced: usize,
}

fn event_from_row<R>(row: &R) -> Result<UsageRecord>
where
    R: Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: for<'a> sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    i64: for<'a> sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    let count = |name: &str| -> Result<u64> {
        u64::try_from(row.try_get::<i64, _>(name)?)
            .map_err(|_| Error::Corrupt(format!("negative {name}")))
    };
    Ok(UsageRecord {
        request_id: row.try_get("request_id")?,
        segment: u32::try_from(row.try_get::<i64, _>("segment")?)
            .map_err(|_| Error::Corrupt("segment out of range".into()))?,
        tenant: row.try_get("tenant_id")?,
        model: row.try_get("model_id")?,
        prompt_tokens: count("prompt_tokens")?,
        cached_prompt_tokens: count("cached_prompt_tokens")?,
        completion_tokens: count("completion_tokens")?,
        worker: row.try_get("worker")?,
        capacity: CapacityType::parse(&row.try_get::<String, _>("capacity")?)
            .map_err(|e| Error::Corrupt(e.to_string()))?,
        started_at: from_us(row.try_get("started_us")?)?,
        ended_at: from_us(row.try_get("ended_us")?)?,
        last: false,
    })
}

impl Ledger {
    /// Prices stored events that had no price in effect, where a version now covers them
    /// (of `model`, or of every model with `None`). Idempotent.
    pub async fn reprice_unpriced(&self, model: Option<&str>) -> Result<RepriceOutcome> {
        let mut outcome = RepriceOutcome::default();
        on_pool!(self, |pool, Db| {
            let mut tx = pool.begin().await?;
            let events = sqlx::query(
                "SELECT request_id, segment, tenant_id, model_id, prompt_tokens, cached_prompt_tokens, \
                 completion_tokens, worker, capacity, started_us, ended_us FROM usage_events \
                 WHERE price_version_id = $1 AND ($2 IS NULL OR model_id = $2)",
            )
            .bind(UNPRICED)
            .bind(model)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(event_from_row)
            .collect::<Result<Vec<_>>>()?;
            outcome.unpriced = events.len();
            let models: BTreeSet<String> = events.iter().map(|e| e.model.clone()).collect();
            let versions: Vec<PriceVersion> = load_versions!(tx, Db, models);
            let newly: Vec<_> = price_records(events, &versions)
                .into_iter()
                .filter(|p| p.price_version_id != UNPRICED)
                .collect();
            let mut moved = Vec::with_capacity(newly.len());
            for p in newly {
                let done = sqlx::query(
                    "UPDATE usage_events SET price_version_id = $1 \
                     WHERE request_id = $2 AND segment = $3 AND price_version_id = $4",
                )
                .bind(p.price_version_id)
                .bind(p.record.request_id.as_str())
                .bind(i64::from(p.record.segment))
                .bind(UNPRICED)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                // A concurrent repricer may have taken it: move each event once.
                if done == 1 {
                    moved.push(p);
                }
            }
            outcome.priced = moved.len();
            if !moved.is_empty() {
                let added = aggregate(&moved)?;
                let mut removed = Deltas::default();
                for (k, t) in &added.daily {
                    let key = crate::usage::DailyKey {
                        price_version_id: UNPRICED,
                        ..k.clone()
                    };
                    let neg = Totals {
                        segments: -t.segments,
                        input_tokens: -t.input_tokens,
                        cached_input_tokens: -t.cached_input_tokens,
                        output_tokens: -t.output_tokens,
                    };
                    removed.daily.entry(key).or_default().add(&neg)?;
                }
                apply_deltas!(tx, Db, added);
                apply_deltas!(tx, Db, removed);
                sqlx::query("DELETE FROM daily_usage WHERE price_version_id = $1 AND segments = 0")
                    .bind(UNPRICED)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        });
        if outcome.priced > 0 {
            tracing::info!(?outcome, "priced usage that had no price");
        }
        Ok(outcome)
    }
}
