//! What the gateway keeps in the ledger besides keys and budgets: per-tenant rate limits.
//!
//! Rate-limit *counters* are not here (they live in Redis, shared by gateway replicas, or in
//! process for `tidal up`); only the configured limits are, next to the budget, so one
//! database holds every tenant setting. Which tenant owns a request id is not here either:
//! that record (`RequestRecord` of the queue crate) lives in the broker beside the request's
//! response stream, which is all a reattaching client can read, and writing it costs the
//! gateway no database commit per request.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::{from_us, on_pool, Ledger};
use crate::error::{Error, Result};
use crate::ledger::tenants::validate_tenant_id;
use crate::ledger::Tenant;

/// A tenant's rate limits; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RateLimits {
    /// Requests admitted per minute.
    pub requests_per_min: Option<u64>,
    /// Tokens (prompt + completion, as finished requests report them) per minute.
    pub tokens_per_min: Option<u64>,
}

impl RateLimits {
    /// Checks that each set limit is at least 1 and fits the database column.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("requests_per_min", self.requests_per_min),
            ("tokens_per_min", self.tokens_per_min),
        ] {
            if let Some(v) = v {
                if v == 0 || i64::try_from(v).is_err() {
                    return Err(Error::Invalid(format!(
                        "{name} must be between 1 and {} (omit it for unlimited), got {v}",
                        i64::MAX
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A tenant with its rate limits, as listed for operators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct TenantSettings {
    /// The tenant (with its budget).
    #[serde(flatten)]
    pub tenant: Tenant,
    /// Its rate limits.
    pub limits: RateLimits,
}

fn limit(v: Option<i64>) -> Option<u64> {
    v.and_then(|v| u64::try_from(v).ok())
}

impl Ledger {
    /// Sets a tenant's rate limits (`None` fields: unlimited).
    pub async fn set_rate_limits(&self, tenant: &str, limits: RateLimits) -> Result<()> {
        validate_tenant_id(tenant)?;
        limits.validate()?;
        let rpm = limits.requests_per_min.map(|v| v as i64);
        let tpm = limits.tokens_per_min.map(|v| v as i64);
        let found = on_pool!(self, |pool, Db| {
            let mut tx = pool.begin().await?;
            let exists = sqlx::query("SELECT 1 FROM tenants WHERE id = $1")
                .bind(tenant)
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
            if exists {
                sqlx::query(
                    "INSERT INTO tenant_rate_limits (tenant_id, requests_per_min, tokens_per_min) \
                     VALUES ($1, $2, $3) ON CONFLICT (tenant_id) DO UPDATE SET \
                     requests_per_min = excluded.requests_per_min, \
                     tokens_per_min = excluded.tokens_per_min",
                )
                .bind(tenant)
                .bind(rpm)
                .bind(tpm)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
            exists
        });
        if !found {
            return Err(Error::NotFound(format!("tenant {tenant:?}")));
        }
        tracing::info!(tenant, ?limits, "rate limits set");
        Ok(())
    }

    /// A tenant's rate limits ([`Error::NotFound`] for an unknown tenant).
    pub async fn rate_limits(&self, tenant: &str) -> Result<RateLimits> {
        validate_tenant_id(tenant)?;
        let row: Option<(Option<i64>, Option<i64>)> = on_pool!(self, |pool, Db| {
            sqlx::query(
                "SELECT l.requests_per_min, l.tokens_per_min FROM tenants t \
                 LEFT JOIN tenant_rate_limits l ON l.tenant_id = t.id WHERE t.id = $1",
            )
            .bind(tenant)
            .fetch_optional(pool)
            .await?
            .map(|row| -> Result<_> {
                Ok((
                    row.try_get("requests_per_min")?,
                    row.try_get("tokens_per_min")?,
                ))
            })
            .transpose()?
        });
        let (rpm, tpm) = row.ok_or_else(|| Error::NotFound(format!("tenant {tenant:?}")))?;
        Ok(RateLimits {
            requests_per_min: limit(rpm),
            tokens_per_min: limit(tpm),
        })
    }

    /// Every tenant with its budget and rate limits, by id.
    pub async fn tenant_settings(&self) -> Result<Vec<TenantSettings>> {
        on_pool!(self, |pool, Db| {
            sqlx::query(
                "SELECT t.id, t.name, t.created_us, t.monthly_budget_micros, \
                 l.requests_per_min, l.tokens_per_min FROM tenants t \
                 LEFT JOIN tenant_rate_limits l ON l.tenant_id = t.id ORDER BY t.id",
            )
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| -> Result<TenantSettings> {
                Ok(TenantSettings {
                    tenant: Tenant {
                        id: row.try_get("id")?,
                        name: row.try_get("name")?,
                        created_at: from_us(row.try_get("created_us")?)?,
                        monthly_budget_micros: row.try_get("monthly_budget_micros")?,
                    },
                    limits: RateLimits {
                        requests_per_min: limit(row.try_get("requests_per_min")?),
                        tokens_per_min: limit(row.try_get("tokens_per_min")?),
                    },
                })
            })
            .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_must_be_positive_and_fit() {
        assert!(RateLimits::default().validate().is_ok());
        let ok = RateLimits {
            requests_per_min: Some(1),
            tokens_per_min: Some(i64::MAX as u64),
        };
        assert!(ok.validate().is_ok());
        for bad in [
            RateLimits {
                requests_per_min: Some(0),
                tokens_per_min: None,
            },
            RateLimits {
                requests_per_min: None,
                tokens_per_min: Some(u64::MAX),
            },
        ] {
            assert!(matches!(bad.validate(), Err(Error::Invalid(_))), "{bad:?}");
        }
    }
}
