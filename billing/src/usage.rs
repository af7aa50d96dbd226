//! Usage events (one per generation segment) and their pure aggregation into daily totals.
//!
//! `(request_id, segment)` is the idempotency key: the ledger stores each key once, and only
//! newly stored events reach [`aggregate`], so a replayed or duplicated event changes nothing.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::money::{cost_picos, TokenKind};
use crate::period::Month;
use crate::price::{price_at, PriceVersion, Prices, UNPRICED};

/// Longest accepted id (request, tenant, model, worker).
pub const MAX_ID_LEN: usize = 256;
/// Most tokens of one kind accepted in one segment (far above any context length; keeps
/// every sum of a day's segments well inside `i64`).
pub const MAX_SEGMENT_TOKENS: u64 = 1 << 32;

/// A validated token count as stored (`i64`).
pub(crate) fn stored_tokens(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Which kind of capacity served a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacityType {
    /// Spot / preemptible nodes.
    Spot,
    /// On-demand nodes (and local single-machine workers).
    OnDemand,
}

impl CapacityType {
    /// Stable name used in the database, CSV and the usage stream.
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::Spot => "spot",
            CapacityType::OnDemand => "on_demand",
        }
    }

    /// Parses [`CapacityType::as_str`] output (also accepts `on-demand` and `ondemand`).
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "spot" => Ok(CapacityType::Spot),
            "on_demand" | "on-demand" | "ondemand" => Ok(CapacityType::OnDemand),
            other => Err(Error::Invalid(format!("unknown capacity type {other:?}"))),
        }
    }
}

/// One usage event: a stretch of generation of one request by one worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Request id (UUIDv7 from the gateway).
    pub request_id: String,
    /// Segment number within the request (0 for the first worker, +1 per resume).
    pub segment: u32,
    /// Tenant id.
    pub tenant: String,
    /// Model id.
    pub model: String,
    /// All prompt tokens of the segment, cached ones included.
    pub prompt_tokens: u64,
    /// The subset of `prompt_tokens` served from the prefix cache.
    pub cached_prompt_tokens: u64,
    /// Generated tokens delivered in this segment.
    pub completion_tokens: u64,
    /// Worker that served the segment.
    pub worker: String,
    /// Capacity type of that worker.
    pub capacity: CapacityType,
    /// Segment start.
    pub started_at: DateTime<Utc>,
    /// Segment end; decides the price version and the day.
    pub ended_at: DateTime<Utc>,
    /// The request's last segment: recording it releases the request's budget hold whole.
    #[serde(default)]
    pub last: bool,
}

impl UsageRecord {
    /// The idempotency key.
    pub fn key(&self) -> (&str, u32) {
        (&self.request_id, self.segment)
    }

    /// Checks the record's invariants; the reason is stored with a rejected event.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("request_id", &self.request_id),
            ("tenant", &self.tenant),
            ("model", &self.model),
        ] {
            if v.is_empty() {
                return Err(format!("{name} is empty"));
            }
        }
        for (name, v) in [
            ("request_id", &self.request_id),
            ("tenant", &self.tenant),
            ("model", &self.model),
            ("worker", &self.worker),
        ] {
            if v.len() > MAX_ID_LEN {
                return Err(format!("{name} is longer than {MAX_ID_LEN} bytes"));
            }
        }
        for (name, v) in [
            ("prompt_tokens", self.prompt_tokens),
            ("completion_tokens", self.completion_tokens),
        ] {
            if v > MAX_SEGMENT_TOKENS {
                return Err(format!("{name} {v} exceeds {MAX_SEGMENT_TOKENS}"));
            }
        }
        if self.cached_prompt_tokens > self.prompt_tokens {
            return Err(format!(
                "cached_prompt_tokens {} > prompt_tokens {}",
                self.cached_prompt_tokens, self.prompt_tokens
            ));
        }
        if self.ended_at < self.started_at {
            return Err("ended_at is before started_at".into());
        }
        Ok(())
    }

    /// Billable tokens of one kind (input excludes cached prompt tokens).
    pub fn tokens(&self, kind: TokenKind) -> i64 {
        match kind {
            TokenKind::Input => {
                stored_tokens(self.prompt_tokens.saturating_sub(self.cached_prompt_tokens))
            }
            TokenKind::CachedInput => stored_tokens(self.cached_prompt_tokens),
            TokenKind::Output => stored_tokens(self.completion_tokens),
        }
    }

    /// The UTC day the segment is accounted to (its end).
    pub fn day(&self) -> NaiveDate {
        self.ended_at.date_naive()
    }
}

/// A valid record with the price version that applies to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PricedRecord {
    /// The event.
    pub record: UsageRecord,
    /// Price version id, or [`UNPRICED`] when none was in effect.
    pub price_version_id: i64,
    /// Its prices (zero when unpriced).
    pub prices: Prices,
}

/// Attaches the price version in effect at each record's end time.
pub fn price_records(records: Vec<UsageRecord>, versions: &[PriceVersion]) -> Vec<PricedRecord> {
    records
        .into_iter()
        .map(
            |record| match price_at(versions, &record.model, record.ended_at) {
                Some(v) => PricedRecord {
                    price_version_id: v.id,
                    prices: v.prices,
                    record,
                },
                None => PricedRecord {
                    price_version_id: UNPRICED,
                    prices: Prices::default(),
                    record,
                },
            },
        )
        .collect()
}

/// Key of one daily aggregate row.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DailyKey {
    /// Tenant id.
    pub tenant: String,
    /// Model id.
    pub model: String,
    /// UTC day.
    pub day: NaiveDate,
    /// Capacity type that served the tokens.
    pub capacity: CapacityType,
    /// Price version (or [`UNPRICED`]).
    pub price_version_id: i64,
}

/// Token totals of one aggregate row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Totals {
    /// Number of segments.
    pub segments: i64,
    /// Computed prompt tokens.
    pub input_tokens: i64,
    /// Cached prompt tokens.
    pub cached_input_tokens: i64,
    /// Generated tokens.
    pub output_tokens: i64,
}

impl Totals {
    /// One segment's tokens.
    pub fn of_record(r: &UsageRecord) -> Totals {
        Totals {
            segments: 1,
            input_tokens: r.tokens(TokenKind::Input),
            cached_input_tokens: r.tokens(TokenKind::CachedInput),
            output_tokens: r.tokens(TokenKind::Output),
        }
    }

    /// Tokens of one kind.
    pub fn of(&self, kind: TokenKind) -> i64 {
        match kind {
            TokenKind::Input => self.input_tokens,
            TokenKind::CachedInput => self.cached_input_tokens,
            TokenKind::Output => self.output_tokens,
        }
    }

    /// Adds another total (checked).
    pub fn add(&mut self, other: &Totals) -> Result<(), Error> {
        let add = |a: i64, b: i64| a.checked_add(b).ok_or(Error::Overflow("token totals"));
        self.segments = add(self.segments, other.segments)?;
        self.input_tokens = add(self.input_tokens, other.input_tokens)?;
        self.cached_input_tokens = add(self.cached_input_tokens, other.cached_input_tokens)?;
        self.output_tokens = add(self.output_tokens, other.output_tokens)?;
        Ok(())
    }

    /// Exact cost in picos at `prices`.
    pub fn cost_picos(&self, prices: &Prices) -> i128 {
        TokenKind::ALL
            .iter()
            .map(|&k| cost_picos(self.of(k), prices.of(k)))
            .sum()
    }

    /// All tokens served (prompt, cached included, plus completion).
    pub fn tokens_served(&self) -> i64 {
        self.input_tokens
            .saturating_add(self.cached_input_tokens)
            .saturating_add(self.output_tokens)
    }
}

/// What a batch of newly stored events adds to the aggregates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deltas {
    /// Per daily key, sorted (a fixed lock order for concurrent writers).
    pub daily: BTreeMap<DailyKey, Totals>,
    /// Exact spend in picos per tenant and month, sorted.
    pub spend: BTreeMap<(String, Month), i128>,
}

/// Sums newly stored, priced events into daily and spend deltas.
pub fn aggregate(records: &[PricedRecord]) -> Result<Deltas, Error> {
    let mut deltas = Deltas::default();
    for p in records {
        let r = &p.record;
        let t = Totals::of_record(r);
        let key = DailyKey {
            tenant: r.tenant.clone(),
            model: r.model.clone(),
            day: r.day(),
            capacity: r.capacity,
            price_version_id: p.price_version_id,
        };
        deltas.daily.entry(key).or_default().add(&t)?;
        *deltas
            .spend
            .entry((r.tenant.clone(), Month::of_date(r.day())))
            .or_default() += t.cost_picos(&p.prices);
    }
    Ok(deltas)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;

    pub(crate) fn record(req: &str, seg: u32, tenant: &str, at: DateTime<Utc>) -> UsageRecord {
        UsageRecord {
            request_id: req.into(),
            segment: seg,
            tenant: tenant.into(),
            model: "m".into(),
            prompt_tokens: 10,
            cached_prompt_tokens: 4,
            completion_tokens: 7,
            worker: "w".into(),
            capacity: CapacityType::Spot,
            started_at: at,
            ended_at: at,
            last: false,
        }
    }

    fn t(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 3, h, 0, 0).unwrap()
    }

    #[test]
    fn validation_catches_each_broken_invariant() {
        let ok = record("r", 0, "a", t(1));
        assert!(ok.validate().is_ok());
        let cases: Vec<(UsageRecord, &str)> = vec![
            (
                UsageRecord {
                    request_id: String::new(),
                    ..ok.clone()
                },
                "request_id",
            ),
            (
                UsageRecord {
                    tenant: String::new(),
                    ..ok.clone()
                },
                "tenant",
            ),
            (
                UsageRecord {
                    model: String::new(),
                    ..ok.clone()
                },
                "model",
            ),
            (
                UsageRecord {
                    worker: "x".repeat(MAX_ID_LEN + 1),
                    ..ok.clone()
                },
                "worker",
            ),
            (
                UsageRecord {
                    cached_prompt_tokens: 11,
                    ..ok.clone()
                },
                "cached",
            ),
            (
                UsageRecord {
                    prompt_tokens: MAX_SEGMENT_TOKENS + 1,
                    ..ok.clone()
                },
                "prompt_tokens",
            ),
            (
                UsageRecord {
                    completion_tokens: u64::MAX,
                    ..ok.clone()
                },
                "completion_tokens",
            ),
            (
                UsageRecord {
                    started_at: t(2),
                    ..ok.clone()
                },
                "before",
            ),
        ];
        for (r, needle) in cases {
            let err = r.validate().unwrap_err();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }

    #[test]
    fn billable_tokens_split_cached_from_computed_input() {
        let r = record("r", 0, "a", t(1));
        assert_eq!(r.tokens(TokenKind::Input), 6);
        assert_eq!(r.tokens(TokenKind::CachedInput), 4);
        assert_eq!(r.tokens(TokenKind::Output), 7);
    }

    #[test]
    fn pricing_uses_end_time_and_marks_unpriced() {
        let versions = vec![PriceVersion {
            id: 7,
            model: "m".into(),
            effective_from: t(12),
            prices: Prices {
                input_per_m: 1,
                cached_input_per_m: 2,
                output_per_m: 3,
            },
        }];
        let mut before = record("a", 0, "x", t(11));
        before.ended_at = t(11);
        let mut straddles = record("b", 0, "x", t(11));
        straddles.ended_at = t(13);
        let priced = price_records(vec![before, straddles], &versions);
        assert_eq!(priced[0].price_version_id, UNPRICED);
        assert_eq!(priced[0].prices, Prices::default());
        assert_eq!(priced[1].price_version_id, 7);
    }

    #[test]
    fn aggregate_sums_per_key_and_spend_per_month() {
        let prices = Prices {
            input_per_m: 1_000_000,
            cached_input_per_m: 100_000,
            output_per_m: 2_000_000,
        };
        let p = |r: UsageRecord, v: i64| PricedRecord {
            record: r,
            price_version_id: v,
            prices,
        };
        let mut other_day = record("c", 0, "a", t(1));
        other_day.ended_at = Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap();
        let mut on_demand = record("d", 0, "a", t(1));
        on_demand.capacity = CapacityType::OnDemand;
        let recs = vec![
            p(record("a", 0, "a", t(1)), 1),
            p(record("a", 1, "a", t(2)), 1),
            p(record("b", 0, "b", t(1)), 1),
            p(record("e", 0, "a", t(3)), 2),
            p(other_day, 1),
            p(on_demand, 1),
        ];
        let d = aggregate(&recs).unwrap();
        assert_eq!(d.daily.len(), 6 - 1, "a/0 and a/1 share a key");
        let key = DailyKey {
            tenant: "a".into(),
            model: "m".into(),
            day: t(1).date_naive(),
            capacity: CapacityType::Spot,
            price_version_id: 1,
        };
        assert_eq!(
            d.daily[&key],
            Totals {
                segments: 2,
                input_tokens: 12,
                cached_input_tokens: 8,
                output_tokens: 14
            }
        );
        // Per event: 6 * 1.0 + 4 * 0.1 + 7 * 2.0 micros = 20.4 micros = 20_400_000 picos.
        let per_event = 20_400_000i128;
        let nov = Month::parse("2026-11").unwrap();
        assert_eq!(d.spend[&("a".to_string(), nov)], 4 * per_event);
        assert_eq!(d.spend[&("a".to_string(), nov.next())], per_event);
        assert_eq!(d.spend[&("b".to_string(), nov)], per_event);
    }

    #[test]
    fn capacity_type_round_trips() {
        for c in [CapacityType::Spot, CapacityType::OnDemand] {
            assert_eq!(CapacityType::parse(c.as_str()).unwrap(), c);
        }
        assert_eq!(
            CapacityType::parse("on-demand").unwrap(),
            CapacityType::OnDemand
        );
        assert!(CapacityType::parse("gpu").is_err());
    }
}
