//! Tenants, API keys and budgets.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::Serialize;
use sqlx::Row;

use super::{from_us, on_pool, to_us, Ledger};
use crate::access::{Principal, Role};
use crate::error::{Error, Result};
use crate::keys;
use crate::money::round_picos;
use crate::period::Month;

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Tenant {
    /// Id (`[a-z0-9][a-z0-9_-]*`, at most 64 bytes).
    pub id: String,
    /// Display name (1 to 128 printable characters).
    pub name: String,
    /// Creation time.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub created_at: DateTime<Utc>,
    /// Monthly spend limit in micro-units, `None` for unlimited.
    pub monthly_budget_micros: Option<i64>,
}

/// A key just issued: the only time its secret is visible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct IssuedKey {
    /// Key id.
    pub key_id: String,
    /// The secret (`tidal_...`): show once, never stored.
    pub secret: String,
    /// Display prefix.
    pub prefix: String,
    /// Tenant.
    pub tenant: String,
    /// Role.
    pub role: Role,
}

/// A stored key as listed (no secret, no hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct KeyInfo {
    /// Key id.
    pub key_id: String,
    /// Display prefix.
    pub prefix: String,
    /// Role.
    pub role: Role,
    /// Creation time.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub created_at: DateTime<Utc>,
    /// Revocation time, if revoked.
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A tenant's spend against its monthly budget, as the gateway checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub struct BudgetStatus {
    /// The month.
    pub month: Month,
    /// Budget in micros (`None`: unlimited).
    pub budget_micros: Option<i64>,
    /// Spend so far in micros (exact running spend, rounded once, half-up).
    pub spent_micros: i64,
    /// Budget minus spend (`None`: unlimited; may be negative).
    pub remaining_micros: Option<i64>,
    /// Whether spend has reached the budget: the gateway refuses new requests.
    pub exhausted: bool,
}

/// A stored key found by prefix: id, tenant, hash, role, revocation time.
type KeyCandidate = (String, String, Vec<u8>, String, Option<i64>);

/// Checks a tenant id: `[a-z0-9][a-z0-9_-]*`, at most 64 bytes. Every method taking a
/// tenant id checks it, so a malformed one is [`Error::Invalid`] and never reaches the
/// database (where a NUL byte, say, would fail as a database error).
pub(crate) fn validate_tenant_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "tenant id {id:?} must match [a-z0-9][a-z0-9_-]{{0,63}}"
        )))
    }
}

/// Longest tenant display name, in characters.
const MAX_TENANT_NAME_CHARS: usize = 128;

/// Whether `c` may appear in a display name: no control characters (C0, DEL, C1), line or
/// paragraph separators, or bidirectional overrides (which could disguise a name).
fn printable(c: char) -> bool {
    !(c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
}

/// Checks a tenant display name: 1 to [`MAX_TENANT_NAME_CHARS`] printable characters.
pub(crate) fn validate_tenant_name(name: &str) -> Result<()> {
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_TENANT_NAME_CHARS {
        return Err(Error::Invalid(format!(
            "tenant name must be 1 to {MAX_TENANT_NAME_CHARS} characters, got {chars}"
        )));
    }
    if let Some(c) = name.chars().find(|c| !printable(*c)) {
        return Err(Error::Invalid(format!(
            "tenant name must be printable; it contains {:?}",
            c
        )));
    }
    Ok(())
}

/// Pure budget arithmetic.
pub(crate) fn budget_status(
    month: Month,
    budget_micros: Option<i64>,
    spent_picos: i64,
) -> Result<BudgetStatus> {
    let spent_micros = round_picos(i128::from(spent_picos))?;
    let remaining_micros = budget_micros.map(|b| b.saturating_sub(spent_micros));
    Ok(BudgetStatus {
        month,
        budget_micros,
        spent_micros,
        remaining_micros,
        exhausted: remaining_micros.is_some_and(|r| r <= 0),
    })
}

impl Ledger {
    /// Creates a tenant; fails with [`Error::Invalid`] if the id is malformed, with
    /// [`Error::Conflict`] if it is taken.
    pub async fn create_tenant(&self, id: &str, name: &str, now: DateTime<Utc>) -> Result<Tenant> {
        validate_tenant_id(id)?;
        validate_tenant_name(name)?;
        let inserted = on_pool!(self, |pool, Db| {
            sqlx::query(
                "INSERT INTO tenants (id, name, created_us) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
            )
            .bind(id)
            .bind(name)
            .bind(to_us(now))
            .execute(pool)
            .await?
            .rows_affected()
        });
        if inserted == 0 {
            return Err(Error::Conflict(format!("tenant {id:?} already exists")));
        }
        tracing::info!(tenant = id, "tenant created");
        Ok(Tenant {
            id: id.into(),
            name: name.into(),
            created_at: now,
            monthly_budget_micros: None,
        })
    }

    /// Reads a tenant (a tenant key may read only its own).
    pub async fn tenant(&self, principal: &Principal, id: &str) -> Result<Tenant> {
        validate_tenant_id(id)?;
        principal.authorize_tenant(id)?;
        let row = on_pool!(self, |pool, Db| {
            sqlx::query(
                "SELECT id, name, created_us, monthly_budget_micros FROM tenants WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await?
            .map(|row| -> Result<Tenant> {
                Ok(Tenant {
                    id: row.try_get("id")?,
                    name: row.try_get("name")?,
                    created_at: from_us(row.try_get("created_us")?)?,
                    monthly_budget_micros: row.try_get("monthly_budget_micros")?,
                })
            })
            .transpose()?
        });
        row.ok_or_else(|| Error::NotFound(format!("tenant {id:?}")))
    }

    /// Issues a new key for an existing tenant; the secret is returned once and never stored.
    pub async fn issue_key(
        &self,
        tenant: &str,
        role: Role,
        now: DateTime<Utc>,
    ) -> Result<IssuedKey> {
        validate_tenant_id(tenant)?;
        let key = keys::generate();
        let key_id = uuid::Uuid::now_v7().to_string();
        let exists = on_pool!(self, |pool, Db| {
            let mut tx = pool.begin().await?;
            let exists = sqlx::query("SELECT 1 FROM tenants WHERE id = $1")
                .bind(tenant)
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
            if exists {
                sqlx::query(
                    "INSERT INTO api_keys (id, tenant_id, prefix, key_hash, role, created_us) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(key_id.as_str())
                .bind(tenant)
                .bind(key.prefix.as_str())
                .bind(key.hash.to_vec())
                .bind(role.as_str())
                .bind(to_us(now))
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
            exists
        });
        if !exists {
            return Err(Error::NotFound(format!("tenant {tenant:?}")));
        }
        tracing::info!(tenant, key_id = %key_id, prefix = %key.prefix, "api key issued");
        Ok(IssuedKey {
            key_id,
            secret: key.secret,
            prefix: key.prefix,
            tenant: tenant.into(),
            role,
        })
    }

    /// Revokes a key (idempotent: revoking twice keeps the first revocation time).
    pub async fn revoke_key(&self, key_id: &str, now: DateTime<Utc>) -> Result<()> {
        // Key ids are UUIDs: anything else names no key (and never reaches the database).
        if uuid::Uuid::parse_str(key_id).is_err() {
            return Err(Error::NotFound(format!("api key {key_id:?}")));
        }
        let found = on_pool!(self, |pool, Db| {
            sqlx::query("UPDATE api_keys SET revoked_us = COALESCE(revoked_us, $2) WHERE id = $1")
                .bind(key_id)
                .bind(to_us(now))
                .execute(pool)
                .await?
                .rows_affected()
        });
        if found == 0 {
            return Err(Error::NotFound(format!("api key {key_id:?}")));
        }
        tracing::info!(key_id, "api key revoked");
        Ok(())
    }

    /// Authenticates a presented key: `Some` for a known, unrevoked key, else `None`.
    ///
    /// Candidates are found by display prefix; each stored hash is compared in constant time.
    pub async fn authenticate(&self, secret: &str) -> Result<Option<Principal>> {
        let Some(prefix) = keys::display_prefix(secret) else {
            return Ok(None);
        };
        let hash = keys::hash_key(secret);
        let candidates: Vec<KeyCandidate> = on_pool!(self, |pool, Db| {
            sqlx::query(
                "SELECT id, tenant_id, key_hash, role, revoked_us FROM api_keys WHERE prefix = $1",
            )
            .bind(prefix)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| -> Result<_> {
                Ok((
                    row.try_get("id")?,
                    row.try_get("tenant_id")?,
                    row.try_get("key_hash")?,
                    row.try_get("role")?,
                    row.try_get("revoked_us")?,
                ))
            })
            .collect::<Result<Vec<_>>>()?
        });
        let mut found = None;
        for (key_id, tenant, stored, role, revoked) in candidates {
            // No early exit: every candidate is compared.
            if keys::hashes_equal(&stored, &hash) && revoked.is_none() {
                found = Some(Principal {
                    key_id,
                    tenant,
                    role: Role::parse(&role)?,
                });
            }
        }
        Ok(found)
    }

    /// Lists a tenant's keys (no secrets).
    pub async fn list_keys(&self, principal: &Principal, tenant: &str) -> Result<Vec<KeyInfo>> {
        validate_tenant_id(tenant)?;
        principal.authorize_tenant(tenant)?;
        on_pool!(self, |pool, Db| {
            sqlx::query(
                "SELECT id, prefix, role, created_us, revoked_us FROM api_keys \
                 WHERE tenant_id = $1 ORDER BY created_us, id",
            )
            .bind(tenant)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| -> Result<KeyInfo> {
                Ok(KeyInfo {
                    key_id: row.try_get("id")?,
                    prefix: row.try_get("prefix")?,
                    role: Role::parse(row.try_get::<&str, _>("role")?)?,
                    created_at: from_us(row.try_get("created_us")?)?,
                    revoked_at: row
                        .try_get::<Option<i64>, _>("revoked_us")?
                        .map(from_us)
                        .transpose()?,
                })
            })
            .collect()
        })
    }

    /// Sets (or clears, with `None`) a tenant's monthly budget in micros.
    pub async fn set_budget(&self, tenant: &str, monthly_budget_micros: Option<i64>) -> Result<()> {
        validate_tenant_id(tenant)?;
        if monthly_budget_micros.is_some_and(|b| b < 0) {
            return Err(Error::Invalid("budget must not be negative".into()));
        }
        let found = on_pool!(self, |pool, Db| {
            sqlx::query("UPDATE tenants SET monthly_budget_micros = $2 WHERE id = $1")
                .bind(tenant)
                .bind(monthly_budget_micros)
                .execute(pool)
                .await?
                .rows_affected()
        });
        if found == 0 {
            return Err(Error::NotFound(format!("tenant {tenant:?}")));
        }
        Ok(())
    }

    /// The tenant's spend in the month containing `now`, against its budget.
    ///
    /// Spend is updated in the same transaction that stores usage, so it lags delivery by
    /// the consumer's batch latency only (see [`crate::consumer`]).
    pub async fn budget_status(
        &self,
        principal: &Principal,
        tenant: &str,
        now: DateTime<Utc>,
    ) -> Result<BudgetStatus> {
        validate_tenant_id(tenant)?;
        principal.authorize_tenant(tenant)?;
        let month = Month::of_instant(now);
        let (budget, spent) = on_pool!(self, |pool, Db| {
            let budget: Option<Option<i64>> =
                sqlx::query("SELECT monthly_budget_micros FROM tenants WHERE id = $1")
                    .bind(tenant)
                    .fetch_optional(pool)
                    .await?
                    .map(|row| row.try_get("monthly_budget_micros"))
                    .transpose()?;
            let spent: Option<i64> = sqlx::query(
                "SELECT spent_pico FROM tenant_spend WHERE tenant_id = $1 AND month = $2",
            )
            .bind(tenant)
            .bind(month.to_string())
            .fetch_optional(pool)
            .await?
            .map(|row| row.try_get("spent_pico"))
            .transpose()?;
            (budget, spent)
        });
        let budget = budget.ok_or_else(|| Error::NotFound(format!("tenant {tenant:?}")))?;
        budget_status(month, budget, spent.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids() {
        for ok in ["a", "acme", "acme-2", "0_x", &"a".repeat(64)] {
            assert!(validate_tenant_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "_a", "Acme", "a b", "a/b", "é", &"a".repeat(65)] {
            assert!(validate_tenant_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tenant_names() {
        for ok in [
            "Acme",
            "Acme GmbH & Co. KG",
            "株式会社",
            "é",
            &"x".repeat(128),
        ] {
            assert!(validate_tenant_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a\0b",
            "tab\there",
            "new\nline",
            "\u{7f}",
            "\u{85}",
            "a\u{2028}b",
            "evil\u{202e}gnp",
            &"x".repeat(129),
        ] {
            assert!(
                matches!(validate_tenant_name(bad), Err(Error::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn budget_arithmetic() {
        let m = Month::parse("2026-11").unwrap();
        let s = budget_status(m, Some(1_000_000), 999_999_500_000).unwrap();
        assert_eq!(s.spent_micros, 1_000_000, "999,999.5 micros rounds half-up");
        assert_eq!(s.remaining_micros, Some(0));
        assert!(s.exhausted);
        let s = budget_status(m, Some(1_000_000), 999_999_499_999).unwrap();
        assert_eq!(s.spent_micros, 999_999);
        assert_eq!(s.remaining_micros, Some(1));
        assert!(!s.exhausted);
        let s = budget_status(m, None, i64::MAX).unwrap();
        assert_eq!(s.remaining_micros, None);
        assert!(!s.exhausted, "no budget, never exhausted");
        let s = budget_status(m, Some(0), 0).unwrap();
        assert!(s.exhausted, "a zero budget allows nothing");
    }
}
