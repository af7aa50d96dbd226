//! Invoices for a calendar month: pure construction, immutability and adjustments.
//!
//! A line item is one (service month, model, price version, token kind); its amount is
//! `tokens * unit price / 1e6` rounded once, half-up. The invoice total is the sum of its
//! line items. Once issued, an invoice is stored and never recomputed. Usage that arrives
//! later for an invoiced month becomes *adjustment* lines on the next invoice issued: for
//! each line key, the amount billed so far (all earlier invoices) is compared with the
//! amount the month's current tokens cost, and the difference is billed. So over all
//! invoices each line key is charged exactly `round(final tokens * price)`.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::money::{format_micros, line_cost_micros, TokenKind};
use crate::period::Month;
use crate::price::UNPRICED;
use crate::report::UsageRow;

/// Currency of all amounts (micro-units of it).
pub const CURRENCY: &str = "USD";

/// Whether an invoice is stored for good or only computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvoiceStatus {
    /// Computed from current usage; changes as usage arrives.
    Draft,
    /// Stored; never changes.
    Issued,
}

/// One invoice line item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceLine {
    /// The month whose usage this line bills.
    pub service_month: Month,
    /// Model id.
    pub model: String,
    /// Price version id.
    pub price_version_id: i64,
    /// Token kind.
    pub kind: TokenKind,
    /// Tokens (negative only on an adjustment that removes usage).
    pub tokens: i64,
    /// Price per million tokens in micros.
    pub unit_price_per_m: i64,
    /// Amount in micros.
    pub amount_micros: i64,
    /// Whether this corrects an earlier, issued month.
    pub adjustment: bool,
}

/// An invoice (draft or issued).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invoice {
    /// Id once issued.
    pub id: Option<String>,
    /// Tenant id.
    pub tenant: String,
    /// The month invoiced.
    pub month: Month,
    /// Draft or issued.
    pub status: InvoiceStatus,
    /// Issue time.
    pub issued_at: Option<DateTime<Utc>>,
    /// Currency code.
    pub currency: String,
    /// Line items: the month's usage first, then adjustments, each sorted by key.
    pub lines: Vec<InvoiceLine>,
    /// Sum of line amounts in micros.
    pub total_micros: i64,
    /// Tokens with no price in the billed months (an invoice with any cannot be issued).
    pub unpriced_tokens: i64,
}

type LineKey = (Month, String, i64, TokenKind);

/// Builds `tenant`'s invoice for `month`.
///
/// `rows`: the tenant's aggregate rows (any days; only `month` and `issued_months` before it
/// are used). `billed`: every line of the tenant's issued invoices. `issued_months`: months
/// that already have an issued invoice.
pub fn build_invoice(
    tenant: &str,
    month: Month,
    rows: &[UsageRow],
    billed: &[InvoiceLine],
    issued_months: &BTreeSet<Month>,
) -> Result<Invoice> {
    let adjustable = |m: Month| m < month && issued_months.contains(&m);
    let mut current: BTreeMap<LineKey, (i64, i64)> = BTreeMap::new();
    let mut unpriced_tokens = 0i64;
    for row in rows.iter().filter(|r| r.tenant == tenant) {
        let m = Month::of_date(row.day);
        if m != month && !adjustable(m) {
            continue;
        }
        if row.price_version_id == UNPRICED {
            unpriced_tokens = unpriced_tokens.saturating_add(row.totals.tokens_served());
            continue;
        }
        for kind in TokenKind::ALL {
            let key = (m, row.model.clone(), row.price_version_id, kind);
            let entry = current.entry(key).or_insert((0, row.prices.of(kind)));
            entry.0 = entry
                .0
                .checked_add(row.totals.of(kind))
                .ok_or(Error::Overflow("invoice tokens"))?;
        }
    }

    let mut billed_by_key: BTreeMap<LineKey, (i64, i64, i64)> = BTreeMap::new();
    for l in billed.iter().filter(|l| adjustable(l.service_month)) {
        let key = (l.service_month, l.model.clone(), l.price_version_id, l.kind);
        let e = billed_by_key
            .entry(key)
            .or_insert((0, 0, l.unit_price_per_m));
        e.0 += l.tokens;
        e.1 += l.amount_micros;
    }

    let mut lines = Vec::new();
    let mut adjustments = Vec::new();
    let keys: BTreeSet<&LineKey> = current.keys().chain(billed_by_key.keys()).collect();
    for key in keys {
        let (service_month, model, price_version_id, kind) = key.clone();
        let (tokens, price) = current.get(key).copied().unwrap_or_else(|| {
            let price = billed_by_key.get(key).map_or(0, |b| b.2);
            (0, price)
        });
        let amount = line_cost_micros(tokens, price)?;
        if service_month == month {
            if tokens != 0 {
                lines.push(InvoiceLine {
                    service_month,
                    model,
                    price_version_id,
                    kind,
                    tokens,
                    unit_price_per_m: price,
                    amount_micros: amount,
                    adjustment: false,
                });
            }
            continue;
        }
        let (billed_tokens, billed_amount, _) =
            billed_by_key.get(key).copied().unwrap_or((0, 0, price));
        if tokens != billed_tokens || amount != billed_amount {
            adjustments.push(InvoiceLine {
                service_month,
                model,
                price_version_id,
                kind,
                tokens: tokens - billed_tokens,
                unit_price_per_m: price,
                amount_micros: amount - billed_amount,
                adjustment: true,
            });
        }
    }
    lines.extend(adjustments);
    let total_micros = lines
        .iter()
        .try_fold(0i64, |acc, l| acc.checked_add(l.amount_micros))
        .ok_or(Error::Overflow("invoice total"))?;
    Ok(Invoice {
        id: None,
        tenant: tenant.into(),
        month,
        status: InvoiceStatus::Draft,
        issued_at: None,
        currency: CURRENCY.into(),
        lines,
        total_micros,
        unpriced_tokens,
    })
}

/// Renders an invoice as pretty JSON.
pub fn render_json(invoice: &Invoice) -> Result<String> {
    serde_json::to_string_pretty(invoice).map_err(|e| Error::Invalid(e.to_string()))
}

/// Renders an invoice's line items as CSV, with a final total row.
pub fn render_csv(invoice: &Invoice) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let csv_err = |e: csv::Error| Error::Csv(e.to_string());
    w.write_record([
        "tenant",
        "invoice_month",
        "service_month",
        "model",
        "price_version",
        "kind",
        "tokens",
        "unit_price_per_million_micros",
        "amount_micros",
        "amount",
        "adjustment",
    ])
    .map_err(csv_err)?;
    let month = invoice.month.to_string();
    for l in &invoice.lines {
        w.write_record([
            invoice.tenant.clone(),
            month.clone(),
            l.service_month.to_string(),
            l.model.clone(),
            l.price_version_id.to_string(),
            l.kind.as_str().to_string(),
            l.tokens.to_string(),
            l.unit_price_per_m.to_string(),
            l.amount_micros.to_string(),
            format_micros(l.amount_micros),
            l.adjustment.to_string(),
        ])
        .map_err(csv_err)?;
    }
    let total = invoice.total_micros;
    w.write_record([
        invoice.tenant.as_str(),
        month.as_str(),
        "",
        "",
        "",
        "total",
        "",
        "",
        &total.to_string(),
        &format_micros(total),
        "",
    ])
    .map_err(csv_err)?;
    let bytes = w.into_inner().map_err(|e| Error::Csv(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| Error::Csv(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::price::Prices;
    use crate::report::tests::row;
    use chrono::NaiveDate;

    const P: Prices = Prices {
        input_per_m: 150_000,
        cached_input_per_m: 75_000,
        output_per_m: 600_000,
    };
    const Q: Prices = Prices {
        input_per_m: 300_000,
        cached_input_per_m: 0,
        output_per_m: 1_200_000,
    };

    fn nov() -> Month {
        Month::parse("2026-11").unwrap()
    }

    #[test]
    fn a_month_of_tiny_events_is_rounded_once_per_line() {
        // 30 days x 33,333 one-token rows: per-event rounding would bill nothing.
        let rows: Vec<UsageRow> = (1..=30)
            .flat_map(|d| (0..33_333).map(move |_| row("a", "m", d, 1, P, (1, 0, 1))))
            .collect();
        let inv = build_invoice("a", nov(), &rows, &[], &BTreeSet::new()).unwrap();
        assert_eq!(inv.lines.len(), 2, "zero-token kinds produce no line");
        let tokens = 30 * 33_333;
        assert_eq!(inv.lines[0].kind, TokenKind::Input);
        assert_eq!(inv.lines[0].tokens, tokens);
        // 999,990 tokens * 0.15 micro = 149,998.5 -> 149,999 (half-up).
        assert_eq!(inv.lines[0].amount_micros, 149_999);
        assert_eq!(inv.lines[1].amount_micros, 599_994);
        assert_eq!(inv.total_micros, 149_999 + 599_994);
        assert_eq!(inv.status, InvoiceStatus::Draft);
        assert_eq!(inv.unpriced_tokens, 0);
    }

    #[test]
    fn lines_split_by_price_version_and_model_and_ignore_other_months_and_tenants() {
        let rows = vec![
            row("a", "m", 3, 1, P, (1_000_000, 0, 0)),
            row("a", "m", 3, 2, Q, (1_000_000, 0, 0)),
            row("a", "n", 4, 1, P, (0, 2_000_000, 0)),
            row("b", "m", 3, 1, P, (5_000_000, 0, 0)),
            UsageRow {
                day: NaiveDate::from_ymd_opt(2026, 12, 1).unwrap(),
                ..row("a", "m", 1, 1, P, (1, 1, 1))
            },
            UsageRow {
                day: NaiveDate::from_ymd_opt(2026, 10, 1).unwrap(),
                ..row("a", "m", 1, 1, P, (1, 1, 1))
            },
        ];
        let inv = build_invoice("a", nov(), &rows, &[], &BTreeSet::new()).unwrap();
        let summary: Vec<_> = inv
            .lines
            .iter()
            .map(|l| {
                (
                    l.model.as_str(),
                    l.price_version_id,
                    l.kind,
                    l.amount_micros,
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("m", 1, TokenKind::Input, 150_000),
                ("m", 2, TokenKind::Input, 300_000),
                ("n", 1, TokenKind::CachedInput, 150_000),
            ]
        );
        assert_eq!(inv.total_micros, 600_000);
        assert!(inv
            .lines
            .iter()
            .all(|l| !l.adjustment && l.service_month == nov()));
    }

    #[test]
    fn late_usage_for_an_issued_month_becomes_an_adjustment_next_month() {
        let oct = Month::parse("2026-10").unwrap();
        let oct_day = |tokens| UsageRow {
            day: NaiveDate::from_ymd_opt(2026, 10, 31).unwrap(),
            ..row("a", "m", 1, 1, P, (tokens, 0, 0))
        };
        // October was issued with 3 tokens (0.45 micro -> 0).
        let issued_oct = build_invoice("a", oct, &[oct_day(3)], &[], &BTreeSet::new()).unwrap();
        assert_eq!(issued_oct.total_micros, 0);
        // Then 1,000,000 more October tokens arrive late, plus November usage.
        let rows = vec![
            oct_day(3),
            oct_day(1_000_000),
            row("a", "m", 2, 1, P, (10, 0, 0)),
        ];
        let issued: BTreeSet<Month> = [oct].into();
        let inv = build_invoice("a", nov(), &rows, &issued_oct.lines, &issued).unwrap();
        let adj: Vec<_> = inv.lines.iter().filter(|l| l.adjustment).collect();
        assert_eq!(adj.len(), 1);
        assert_eq!(adj[0].service_month, oct);
        assert_eq!(adj[0].tokens, 1_000_000);
        // October in total must cost round(1,000,003 * 0.15) = 150,000 (150,000.45).
        assert_eq!(adj[0].amount_micros, 150_000 - issued_oct.total_micros);
        assert_eq!(inv.lines[0].amount_micros, 2, "10 Nov tokens = 1.5 -> 2");
        assert_eq!(inv.total_micros, 150_002);

        // Nothing late since: no adjustment the month after.
        let mut billed = issued_oct.lines.clone();
        billed.extend(inv.lines.clone());
        let dec = nov().next();
        let issued: BTreeSet<Month> = [oct, nov()].into();
        let next = build_invoice("a", dec, &rows, &billed, &issued).unwrap();
        assert!(next.lines.is_empty());
        assert_eq!(next.total_micros, 0);
    }

    #[test]
    fn usage_in_unissued_earlier_months_is_not_adjusted_here() {
        let oct_row = UsageRow {
            day: NaiveDate::from_ymd_opt(2026, 10, 5).unwrap(),
            ..row("a", "m", 1, 1, P, (1_000_000, 0, 0))
        };
        let inv = build_invoice("a", nov(), &[oct_row], &[], &BTreeSet::new()).unwrap();
        assert!(
            inv.lines.is_empty(),
            "October bills on October's own invoice"
        );
    }

    #[test]
    fn unpriced_usage_is_reported() {
        let rows = vec![row("a", "m", 2, UNPRICED, Prices::default(), (4, 0, 6))];
        let inv = build_invoice("a", nov(), &rows, &[], &BTreeSet::new()).unwrap();
        assert_eq!(inv.unpriced_tokens, 10);
        assert!(inv.lines.is_empty());
    }

    #[test]
    fn csv_has_lines_and_total() {
        let rows = vec![row("a", "m", 3, 1, P, (1_000_000, 0, 0))];
        let inv = build_invoice("a", nov(), &rows, &[], &BTreeSet::new()).unwrap();
        let csv = render_csv(&inv).unwrap();
        let lines: Vec<_> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[1],
            "a,2026-11,2026-11,m,1,input,1000000,150000,150000,0.150000,false"
        );
        assert_eq!(lines[2], "a,2026-11,,,,total,,,150000,0.150000,");
        let back: Invoice = serde_json::from_str(&render_json(&inv).unwrap()).unwrap();
        assert_eq!(back, inv);
    }
}
