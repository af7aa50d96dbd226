//! The price catalogue: per-model prices per million tokens, versioned by effective time.
//!
//! A usage segment is priced by the version of its model in effect at the segment's **end**
//! time (when its tokens had been delivered): the latest version with
//! `effective_from <= ended_at`. Versions are immutable once written, so re-pricing never
//! changes what was already billed; a new price is a new version.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::money::TokenKind;

/// The id the ledger uses for usage that had no price in effect (see [`crate::Ledger`]).
pub const UNPRICED: i64 = 0;

/// Prices of one model, per million tokens, in micro-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Prices {
    /// Per million computed prompt tokens.
    pub input_per_m: i64,
    /// Per million prompt tokens served from the prefix cache.
    pub cached_input_per_m: i64,
    /// Per million generated tokens.
    pub output_per_m: i64,
}

impl Prices {
    /// The price of one token kind.
    pub fn of(&self, kind: TokenKind) -> i64 {
        match kind {
            TokenKind::Input => self.input_per_m,
            TokenKind::CachedInput => self.cached_input_per_m,
            TokenKind::Output => self.output_per_m,
        }
    }

    /// Whether every price is non-negative.
    pub fn is_valid(&self) -> bool {
        self.input_per_m >= 0 && self.cached_input_per_m >= 0 && self.output_per_m >= 0
    }
}

impl From<&tidal_queue::Prices> for Prices {
    /// A model record's prices (what the gateway shows and admits on) in the ledger's terms;
    /// a price above `i64::MAX` micros saturates (no model record can carry one: the CRD and
    /// `tidal models` cap prices far below).
    fn from(p: &tidal_queue::Prices) -> Self {
        let micros = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Prices {
            input_per_m: micros(p.input_per_mtok_micros),
            cached_input_per_m: micros(p.cached_input_per_mtok_micros),
            output_per_m: micros(p.output_per_mtok_micros),
        }
    }
}

/// One stored price version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceVersion {
    /// Ledger id (never [`UNPRICED`]).
    pub id: i64,
    /// Model id.
    pub model: String,
    /// When this version takes effect.
    pub effective_from: DateTime<Utc>,
    /// The prices.
    pub prices: Prices,
}

/// The version of `model` in effect at `at`, if any. `versions` may be in any order.
pub fn price_at<'a>(
    versions: &'a [PriceVersion],
    model: &str,
    at: DateTime<Utc>,
) -> Option<&'a PriceVersion> {
    versions
        .iter()
        .filter(|v| v.model == model && v.effective_from <= at)
        .max_by_key(|v| v.effective_from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn v(id: i64, model: &str, hour: u32, input: i64) -> PriceVersion {
        PriceVersion {
            id,
            model: model.into(),
            effective_from: Utc.with_ymd_and_hms(2026, 11, 3, hour, 0, 0).unwrap(),
            prices: Prices {
                input_per_m: input,
                cached_input_per_m: 0,
                output_per_m: 0,
            },
        }
    }

    #[test]
    fn picks_latest_effective_version_of_the_model() {
        let versions = vec![v(2, "m", 12, 200), v(1, "m", 0, 100), v(3, "other", 6, 999)];
        let at = |h, m, s| Utc.with_ymd_and_hms(2026, 11, 3, h, m, s).unwrap();
        assert_eq!(price_at(&versions, "m", at(11, 59, 59)).unwrap().id, 1);
        assert_eq!(
            price_at(&versions, "m", at(12, 0, 0)).unwrap().id,
            2,
            "boundary is inclusive"
        );
        assert_eq!(price_at(&versions, "m", at(23, 0, 0)).unwrap().id, 2);
        assert_eq!(price_at(&versions, "other", at(23, 0, 0)).unwrap().id, 3);
        assert!(
            price_at(&versions, "other", at(5, 0, 0)).is_none(),
            "before first version"
        );
        assert!(price_at(&versions, "missing", at(23, 0, 0)).is_none());
    }

    #[test]
    fn prices_by_kind_and_validity() {
        let p = Prices {
            input_per_m: 1,
            cached_input_per_m: 2,
            output_per_m: 3,
        };
        assert_eq!(p.of(TokenKind::Input), 1);
        assert_eq!(p.of(TokenKind::CachedInput), 2);
        assert_eq!(p.of(TokenKind::Output), 3);
        assert!(p.is_valid());
        assert!(!Prices {
            output_per_m: -1,
            ..p
        }
        .is_valid());
    }
}
