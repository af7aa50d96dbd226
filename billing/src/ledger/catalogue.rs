//! Models, price versions and fleet usage.

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::{from_us, on_pool, to_us, Ledger};
use crate::error::{Error, Result};
use crate::price::{PriceVersion, Prices};
use crate::usage::CapacityType;

/// Fleet time of one model on one capacity type for one day, at one hourly price.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetUsage {
    /// Model id.
    pub model: String,
    /// Capacity type.
    pub capacity: CapacityType,
    /// UTC day.
    pub day: NaiveDate,
    /// Price paid per replica-hour, in micros.
    pub price_per_hour_micros: i64,
    /// Replica time in milliseconds.
    pub replica_ms: i64,
}

impl Ledger {
    /// Makes `prices` the model's prices from `now` on, unless the version in effect at `now`
    /// already has exactly these; returns whether a version was added. For publishers that
    /// restate the same prices on every start or tick (the controller, `tidal up`).
    pub async fn ensure_price(
        &self,
        model: &str,
        prices: Prices,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let versions = self.price_versions(Some(model)).await?;
        let current = versions
            .iter()
            .filter(|v| v.effective_from <= now)
            .max_by_key(|v| v.effective_from);
        if current.is_some_and(|v| v.prices == prices) {
            return Ok(false);
        }
        self.set_price(model, now, prices, now).await?;
        Ok(true)
    }

    /// Adds a price version for `model` (creating the model if needed).
    ///
    /// Idempotent: writing the same prices at the same time again returns the same id; other
    /// prices at an existing time are a [`Error::PriceConflict`], because versions that may
    /// already have priced usage are immutable. Stored usage of the model that had no price
    /// and is covered by the new version is priced by it ([`Ledger::reprice_unpriced`]).
    pub async fn set_price(
        &self,
        model: &str,
        effective_from: DateTime<Utc>,
        prices: Prices,
        now: DateTime<Utc>,
    ) -> Result<i64> {
        if model.is_empty() {
            return Err(Error::Invalid("model id is empty".into()));
        }
        if !prices.is_valid() {
            return Err(Error::Invalid(format!("negative price for {model:?}")));
        }
        let existing: (i64, Prices) = on_pool!(self, |pool, Db| {
            let mut tx = pool.begin().await?;
            sqlx::query(
                "INSERT INTO models (id, created_us) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
            )
            .bind(model)
            .bind(to_us(now))
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO price_versions (model_id, effective_from_us, input_per_m, cached_input_per_m, \
                 output_per_m, created_us) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (model_id, effective_from_us) DO NOTHING",
            )
            .bind(model)
            .bind(to_us(effective_from))
            .bind(prices.input_per_m)
            .bind(prices.cached_input_per_m)
            .bind(prices.output_per_m)
            .bind(to_us(now))
            .execute(&mut *tx)
            .await?;
            let row = sqlx::query(
                "SELECT id, input_per_m, cached_input_per_m, output_per_m FROM price_versions \
                 WHERE model_id = $1 AND effective_from_us = $2",
            )
            .bind(model)
            .bind(to_us(effective_from))
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            (
                row.try_get("id")?,
                Prices {
                    input_per_m: row.try_get("input_per_m")?,
                    cached_input_per_m: row.try_get("cached_input_per_m")?,
                    output_per_m: row.try_get("output_per_m")?,
                },
            )
        });
        if existing.1 != prices {
            return Err(Error::PriceConflict(format!(
                "{model:?} already has other prices effective {effective_from}"
            )));
        }
        // Usage that arrived before any price of this model now gets one.
        self.reprice_unpriced(Some(model)).await?;
        Ok(existing.0)
    }

    /// All price versions, of one model or of all, ordered by model and time.
    pub async fn price_versions(&self, model: Option<&str>) -> Result<Vec<PriceVersion>> {
        on_pool!(self, |pool, Db| {
            sqlx::query(
                "SELECT id, model_id, effective_from_us, input_per_m, cached_input_per_m, output_per_m \
                 FROM price_versions WHERE ($1 IS NULL OR model_id = $1) ORDER BY model_id, effective_from_us",
            )
            .bind(model)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| -> Result<PriceVersion> {
                Ok(PriceVersion {
                    id: row.try_get("id")?,
                    model: row.try_get("model_id")?,
                    effective_from: from_us(row.try_get("effective_from_us")?)?,
                    prices: Prices {
                        input_per_m: row.try_get("input_per_m")?,
                        cached_input_per_m: row.try_get("cached_input_per_m")?,
                        output_per_m: row.try_get("output_per_m")?,
                    },
                })
            })
            .collect()
        })
    }

    /// Records one interval of fleet time, idempotent on `interval_id` (e.g.
    /// `{model}/{capacity}/{window start}`): a repeated report changes nothing. Returns
    /// whether the interval was new.
    pub async fn record_fleet_usage(&self, interval_id: &str, usage: &FleetUsage) -> Result<bool> {
        if usage.replica_ms < 0
            || usage.price_per_hour_micros < 0
            || usage.model.is_empty()
            || interval_id.is_empty()
        {
            return Err(Error::Invalid(format!(
                "bad fleet usage {interval_id:?} {usage:?}"
            )));
        }
        let new = on_pool!(self, |pool, Db| {
            let mut tx = pool.begin().await?;
            let new = sqlx::query(
                "INSERT INTO fleet_intervals (id, model_id, capacity, day, price_per_hour_micros, replica_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
            )
            .bind(interval_id)
            .bind(usage.model.as_str())
            .bind(usage.capacity.as_str())
            .bind(usage.day)
            .bind(usage.price_per_hour_micros)
            .bind(usage.replica_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1;
            if new {
                sqlx::query(
                    "INSERT INTO fleet_usage (model_id, capacity, day, price_per_hour_micros, replica_ms) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (model_id, capacity, day, price_per_hour_micros) \
                     DO UPDATE SET replica_ms = fleet_usage.replica_ms + excluded.replica_ms",
                )
                .bind(usage.model.as_str())
                .bind(usage.capacity.as_str())
                .bind(usage.day)
                .bind(usage.price_per_hour_micros)
                .bind(usage.replica_ms)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            new
        });
        Ok(new)
    }
}
