//! Money: integer micro-units of the platform currency, and the one rounding rule.
//!
//! Prices are quoted per million tokens in micro-units, so the exact cost of `t` tokens at
//! price `p` is `t * p / 1_000_000` micro-units. Its numerator `t * p` is an exact integer in
//! *pico*-units (10^-12 of the currency); the ledger accumulates picos and never rounds them.
//!
//! Rounding rule: a figure shown to a human or charged (an invoice line item, a report cell,
//! a budget check) is rounded **once**, from the exact pico value, **half-up** (ties away from
//! zero, so 0.5 micro becomes 1 micro and -0.5 becomes -1). Events are never rounded one by
//! one: a month of 0.15-micro events is charged as the rounded sum, not as a sum of zeros.

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Pico-units per micro-unit.
pub const PICOS_PER_MICRO: i128 = 1_000_000;
/// Micro-units per unit of currency.
pub const MICROS_PER_UNIT: i64 = 1_000_000;

/// The token kinds that carry a price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// Prompt tokens that were computed (not served from the prefix cache).
    Input,
    /// Prompt tokens served from the prefix cache.
    CachedInput,
    /// Generated tokens.
    Output,
}

impl TokenKind {
    /// All kinds, in invoice order.
    pub const ALL: [TokenKind; 3] = [TokenKind::Input, TokenKind::CachedInput, TokenKind::Output];

    /// Stable lower-case name (used in CSV, JSON and the database).
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Input => "input",
            TokenKind::CachedInput => "cached_input",
            TokenKind::Output => "output",
        }
    }

    /// Parses [`TokenKind::as_str`] output.
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "input" => Ok(TokenKind::Input),
            "cached_input" => Ok(TokenKind::CachedInput),
            "output" => Ok(TokenKind::Output),
            other => Err(Error::Corrupt(format!("unknown token kind {other:?}"))),
        }
    }
}

/// Exact cost in picos of `tokens` at `price_per_million_micros`.
pub fn cost_picos(tokens: i64, price_per_million_micros: i64) -> i128 {
    i128::from(tokens) * i128::from(price_per_million_micros)
}

/// Rounds an exact pico amount to micros, half-up (ties away from zero).
pub fn round_picos(picos: i128) -> Result<i64, Error> {
    let half = PICOS_PER_MICRO / 2;
    let rounded = if picos >= 0 {
        (picos + half) / PICOS_PER_MICRO
    } else {
        -((-picos + half) / PICOS_PER_MICRO)
    };
    i64::try_from(rounded).map_err(|_| Error::Overflow("amount in micro-units"))
}

/// Cost of one line item in micros: `tokens * price / 1e6`, rounded once, half-up.
pub fn line_cost_micros(tokens: i64, price_per_million_micros: i64) -> Result<i64, Error> {
    round_picos(cost_picos(tokens, price_per_million_micros))
}

/// Formats micros as a decimal amount with six places, e.g. `-1.050000`.
pub fn format_micros(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let abs = micros.unsigned_abs();
    let unit = MICROS_PER_UNIT.unsigned_abs();
    format!("{sign}{}.{:06}", abs / unit, abs % unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_half_up_and_exact_elsewhere() {
        assert_eq!(round_picos(0).unwrap(), 0);
        assert_eq!(round_picos(499_999).unwrap(), 0);
        assert_eq!(round_picos(500_000).unwrap(), 1);
        assert_eq!(round_picos(1_499_999).unwrap(), 1);
        assert_eq!(round_picos(1_500_000).unwrap(), 2);
        assert_eq!(round_picos(2_500_000).unwrap(), 3, "half-up, not banker's");
        assert_eq!(round_picos(-500_000).unwrap(), -1);
        assert_eq!(round_picos(-499_999).unwrap(), 0);
        assert_eq!(round_picos(-2_500_000).unwrap(), -3);
    }

    #[test]
    fn rounding_overflow_is_an_error() {
        assert!(round_picos(i128::from(i64::MAX) * PICOS_PER_MICRO * 2).is_err());
        assert_eq!(
            round_picos(i128::from(i64::MAX) * PICOS_PER_MICRO).unwrap(),
            i64::MAX
        );
    }

    #[test]
    fn line_cost_rounds_once_not_per_event() {
        // $0.15 per million tokens: one token costs 0.15 micro.
        let price = 150_000;
        let per_event: i64 = (0..1_000_000)
            .map(|_| line_cost_micros(1, price).unwrap())
            .sum();
        assert_eq!(per_event, 0, "per-event rounding loses everything");
        assert_eq!(line_cost_micros(1_000_000, price).unwrap(), 150_000);
        // 3 tokens at 0.5 micro each = 1.5 micro -> 2.
        assert_eq!(line_cost_micros(3, 500_000).unwrap(), 2);
        // Large but exact: 10^12 tokens at $60/M = $60,000,000 = 6e13 micros.
        assert_eq!(
            line_cost_micros(1_000_000_000_000, 60_000_000).unwrap(),
            60_000_000_000_000
        );
    }

    #[test]
    fn formats_micros() {
        assert_eq!(format_micros(0), "0.000000");
        assert_eq!(format_micros(150_000), "0.150000");
        assert_eq!(format_micros(12_345_678), "12.345678");
        assert_eq!(format_micros(-1_050_000), "-1.050000");
        assert_eq!(format_micros(i64::MIN), "-9223372036854.775808");
    }

    #[test]
    fn token_kind_round_trips() {
        for kind in TokenKind::ALL {
            assert_eq!(TokenKind::parse(kind.as_str()).unwrap(), kind);
        }
        assert!(TokenKind::parse("nope").is_err());
    }
}
