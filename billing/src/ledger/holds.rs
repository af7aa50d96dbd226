//! Budget holds: a tenant's budget is checked against what its admitted requests may still
//! cost, not only against what has been billed, so concurrency cannot overshoot it.
//!
//! As a card payment does: admission places a hold of the request's worst case (prompt and
//! `max_tokens` at the model's prices) in the same transaction that checks
//! `spent + open holds + worst case <= budget`, serialised per tenant by a lock on its row.
//! Ingest counts each billed segment's cost against its request's hold (in the transaction
//! that adds it to the spend), and the gateway lowers the hold to the request's real cost
//! when it ends. A hold counts `max(0, held - ingested)`: never twice with the spend, and
//! never less than what may still be billed. A hold whose gateway died before settling it
//! stops counting at its expiry.
//!
//! So the spend never passes the budget while worst cases are upper bounds; the only
//! overshoot is a request that bills more than its estimate (one request at most per
//! estimate's error), and requests admitted while the budget was unlimited or larger.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;

use super::{on_pool, to_us, Ledger};
use crate::error::{Error, Result};
use crate::money::{round_picos, PICOS_PER_MICRO};
use crate::period::Month;

/// A hold to place for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRequest<'a> {
    /// The request (its id is the hold's key).
    pub request_id: &'a str,
    /// Whose budget.
    pub tenant: &'a str,
    /// The request's worst-case cost in picos.
    pub amount_pico: i64,
    /// When the hold stops counting if nobody settles it.
    pub expires_at: DateTime<Utc>,
}

/// What [`Ledger::hold_budget`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum HoldOutcome {
    /// The tenant has no budget: nothing was held.
    Unlimited,
    /// The hold is placed.
    Held {
        /// Budget left after it, in micros (rounded down).
        remaining_micros: i64,
    },
    /// The worst case does not fit: nothing was held.
    Refused {
        /// The monthly budget.
        budget_micros: i64,
        /// Billed this month plus open holds, in micros (rounded half-up).
        committed_micros: i64,
        /// The request's worst case, in micros (rounded half-up).
        asked_micros: i64,
    },
}

/// The admission arithmetic, in picos: whether `asked` fits beside `spent` and `open` under
/// `budget_micros` (`None`: unlimited).
pub fn decide_hold(
    budget_micros: Option<i64>,
    spent_pico: i64,
    open_pico: i64,
    asked_pico: i64,
) -> Result<HoldOutcome> {
    let Some(budget) = budget_micros else {
        return Ok(HoldOutcome::Unlimited);
    };
    let budget_pico = i128::from(budget) * PICOS_PER_MICRO;
    let committed = i128::from(spent_pico) + i128::from(open_pico.max(0));
    let after = committed + i128::from(asked_pico.max(0));
    if after <= budget_pico {
        let remaining = (budget_pico - after) / PICOS_PER_MICRO;
        Ok(HoldOutcome::Held {
            remaining_micros: i64::try_from(remaining)
                .map_err(|_| Error::Overflow("remaining budget"))?,
        })
    } else {
        Ok(HoldOutcome::Refused {
            budget_micros: budget,
            committed_micros: round_picos(committed)?,
            asked_micros: round_picos(i128::from(asked_pico))?,
        })
    }
}

/// How much of a hold still counts: what it holds beyond what was billed.
const OPEN_SUM: &str =
    "CAST(COALESCE(SUM(CASE WHEN held_pico > ingested_pico THEN held_pico - ingested_pico \
     ELSE 0 END), 0) AS BIGINT)";

impl Ledger {
    /// Places `hold` if the tenant's budget allows it (see the module docs); expired holds
    /// of the tenant are dropped on the way. [`Error::NotFound`] for an unknown tenant.
    pub async fn hold_budget(
        &self,
        hold: &HoldRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<HoldOutcome> {
        if hold.amount_pico < 0 {
            return Err(Error::Invalid("a hold must not be negative".into()));
        }
        let month = Month::of_instant(now).to_string();
        let now_us = to_us(now);
        let outcome = on_pool!(self, |pool, Db| {
            let mut tx = pool.begin().await?;
            // A write first: it takes the tenant's row lock (PostgreSQL) or the write lock
            // (SQLite) before anything is read, so admissions of one tenant run one at a time.
            let budget: Option<Option<i64>> = sqlx::query(
                "UPDATE tenants SET monthly_budget_micros = monthly_budget_micros \
                 WHERE id = $1 RETURNING monthly_budget_micros",
            )
            .bind(hold.tenant)
            .fetch_optional(&mut *tx)
            .await?
            .map(|row| row.try_get("monthly_budget_micros"))
            .transpose()?;
            let Some(budget) = budget else {
                return Err(Error::NotFound(format!("tenant {:?}", hold.tenant)));
            };
            if budget.is_none() {
                tx.commit().await?;
                return Ok(HoldOutcome::Unlimited);
            }
            sqlx::query("DELETE FROM budget_holds WHERE tenant_id = $1 AND expires_us <= $2")
                .bind(hold.tenant)
                .bind(now_us)
                .execute(&mut *tx)
                .await?;
            // One statement, so spend and holds are read from one snapshot: ingest moves an
            // amount from a hold to the spend in one transaction.
            let row = sqlx::query(&format!(
                "SELECT (SELECT spent_pico FROM tenant_spend WHERE tenant_id = $1 AND month = $2) \
                 AS spent, (SELECT {OPEN_SUM} FROM budget_holds WHERE tenant_id = $1 \
                 AND month = $2 AND expires_us > $3) AS open"
            ))
            .bind(hold.tenant)
            .bind(month.as_str())
            .bind(now_us)
            .fetch_one(&mut *tx)
            .await?;
            let spent: Option<i64> = row.try_get("spent")?;
            let open: Option<i64> = row.try_get("open")?;
            let outcome = decide_hold(
                budget,
                spent.unwrap_or(0),
                open.unwrap_or(0),
                hold.amount_pico,
            )?;
            if matches!(outcome, HoldOutcome::Held { .. }) {
                sqlx::query(
                    "INSERT INTO budget_holds (request_id, tenant_id, month, held_pico, \
                     ingested_pico, expires_us) VALUES ($1, $2, $3, $4, 0, $5)",
                )
                .bind(hold.request_id)
                .bind(hold.tenant)
                .bind(month.as_str())
                .bind(hold.amount_pico)
                .bind(to_us(hold.expires_at))
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            outcome
        });
        Ok(outcome)
    }

    /// Lowers request `request_id`'s hold to at most `cost_pico` (what it can still bill in
    /// all: its real cost once it ended, 0 when it never ran) and, with `expires_at`, moves
    /// its expiry no later than that; drops it once billing has caught up with it. A request
    /// without a hold is left alone.
    pub async fn settle_hold(
        &self,
        request_id: &str,
        cost_pico: i64,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let cost = cost_pico.max(0);
        let expires_us = expires_at.map_or(i64::MAX, to_us);
        on_pool!(self, |pool, Db| {
            let mut tx = pool.begin().await?;
            sqlx::query(
                "UPDATE budget_holds SET held_pico = CASE WHEN $2 < held_pico THEN $2 \
                 ELSE held_pico END, expires_us = CASE WHEN $3 < expires_us THEN $3 \
                 ELSE expires_us END WHERE request_id = $1",
            )
            .bind(request_id)
            .bind(cost)
            .bind(expires_us)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "DELETE FROM budget_holds WHERE request_id = $1 AND ingested_pico >= held_pico",
            )
            .bind(request_id)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
        });
        Ok(())
    }

    /// What `tenant`'s open holds of the month containing `now` still count, in picos.
    pub async fn open_holds_pico(&self, tenant: &str, now: DateTime<Utc>) -> Result<i64> {
        let month = Month::of_instant(now).to_string();
        let open: Option<i64> = on_pool!(self, |pool, Db| {
            sqlx::query(&format!(
                "SELECT {OPEN_SUM} AS open FROM budget_holds WHERE tenant_id = $1 \
                 AND month = $2 AND expires_us > $3"
            ))
            .bind(tenant)
            .bind(month.as_str())
            .bind(to_us(now))
            .fetch_one(pool)
            .await?
            .try_get("open")?
        });
        Ok(open.unwrap_or(0))
    }
}

/// Rows per `IN (...)` lookup of held requests.
pub(super) const HELD_CHUNK: usize = 1000;

/// What one ingest batch bills a request: its cost, and whether its last segment was among
/// the records (the request has ended: nothing more can bill against its hold).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct RequestBill {
    /// Picos billed by the batch.
    pub cost_pico: i128,
    /// The batch holds the request's last segment.
    pub last: bool,
}

/// Counts the billed cost of each request in `$costs` (request id → [`RequestBill`]) against
/// its hold, inside ingest transaction `$tx`, and drops the holds billing has caught up with
/// and those of requests that ended.
macro_rules! apply_to_holds {
    ($tx:ident, $db:ty, $costs:expr) => {{
        let costs: &std::collections::BTreeMap<String, super::holds::RequestBill> = $costs;
        let ids: Vec<&str> = costs.keys().map(String::as_str).collect();
        let mut held: Vec<String> = Vec::new();
        for chunk in ids.chunks(super::holds::HELD_CHUNK) {
            let mut qb = sqlx::QueryBuilder::<$db>::new(
                "SELECT request_id FROM budget_holds WHERE request_id IN (",
            );
            let mut sep = qb.separated(", ");
            for id in chunk {
                sep.push_bind(*id);
            }
            qb.push(")");
            for row in qb.build().fetch_all(&mut *$tx).await? {
                held.push(row.try_get("request_id")?);
            }
        }
        for id in &held {
            let bill = costs.get(id).copied().unwrap_or_default();
            let cost = i64::try_from(bill.cost_pico)
                .map_err(|_| $crate::error::Error::Overflow("a request's cost in picos"))?;
            sqlx::query(
                "UPDATE budget_holds SET ingested_pico = ingested_pico + $2 WHERE request_id = $1",
            )
            .bind(id.as_str())
            .bind(cost)
            .execute(&mut *$tx)
            .await?;
            sqlx::query(
                "DELETE FROM budget_holds WHERE request_id = $1 \
                 AND (ingested_pico >= held_pico OR $2)",
            )
            .bind(id.as_str())
            .bind(bill.last)
            .execute(&mut *$tx)
            .await?;
        }
    }};
}
pub(super) use apply_to_holds;

#[cfg(test)]
mod tests {
    use super::*;

    const P: i64 = PICOS_PER_MICRO as i64;

    #[test]
    fn unlimited_holds_nothing() {
        assert_eq!(
            decide_hold(None, i64::MAX, i64::MAX, i64::MAX).unwrap(),
            HoldOutcome::Unlimited
        );
    }

    #[test]
    fn a_hold_fits_exactly_up_to_the_budget() {
        assert_eq!(
            decide_hold(Some(100), 40 * P, 30 * P, 30 * P).unwrap(),
            HoldOutcome::Held {
                remaining_micros: 0
            }
        );
        assert_eq!(
            decide_hold(Some(100), 40 * P, 30 * P, 30 * P + 1).unwrap(),
            HoldOutcome::Refused {
                budget_micros: 100,
                committed_micros: 70,
                asked_micros: 30
            },
            "one pico over is refused"
        );
        assert_eq!(
            decide_hold(Some(100), 10 * P, 0, 5 * P + P / 2).unwrap(),
            HoldOutcome::Held {
                remaining_micros: 84
            },
            "the remainder rounds down"
        );
    }

    #[test]
    fn open_holds_and_spend_both_count() {
        // Either alone leaves room; together they do not.
        assert!(matches!(
            decide_hold(Some(50), 0, 45 * P, 10 * P).unwrap(),
            HoldOutcome::Refused { .. }
        ));
        assert!(matches!(
            decide_hold(Some(50), 45 * P, 0, 10 * P).unwrap(),
            HoldOutcome::Refused { .. }
        ));
        assert!(matches!(
            decide_hold(Some(50), 20 * P, 20 * P, 10 * P).unwrap(),
            HoldOutcome::Held { .. }
        ));
        // A zero budget admits only what costs nothing.
        assert!(matches!(
            decide_hold(Some(0), 0, 0, 0).unwrap(),
            HoldOutcome::Held { .. }
        ));
        assert!(matches!(
            decide_hold(Some(0), 0, 0, 1).unwrap(),
            HoldOutcome::Refused { .. }
        ));
    }

    #[test]
    fn extremes_do_not_overflow() {
        let r = decide_hold(Some(i64::MAX), i64::MAX, i64::MAX, i64::MAX).unwrap();
        assert!(matches!(r, HoldOutcome::Held { .. }), "{r:?}");
        let r = decide_hold(Some(0), i64::MAX, i64::MAX, i64::MAX).unwrap();
        assert!(matches!(r, HoldOutcome::Refused { .. }), "{r:?}");
    }
}
