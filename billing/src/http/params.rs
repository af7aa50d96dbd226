//! Query-parameter rules of the usage API (pure).

use super::error::HttpError;
use crate::access::Principal;
use crate::period::Month;
use crate::Format;

/// `format`: `json` (the default) or `csv`.
pub fn parse_format(value: Option<&str>) -> Result<Format, HttpError> {
    match value {
        None | Some("json") => Ok(Format::Json),
        Some("csv") => Ok(Format::Csv),
        Some(other) => Err(HttpError::invalid(
            "format",
            format!("format must be `json` or `csv`, not {other:?}"),
        )),
    }
}

/// A required `YYYY-MM` month.
pub fn parse_month(value: Option<&str>) -> Result<Month, HttpError> {
    let Some(v) = value else {
        return Err(HttpError::invalid("month", "month is required (YYYY-MM)"));
    };
    Month::parse(v).map_err(|e| HttpError::invalid("month", format!("bad month {v:?}: {e}")))
}

/// The tenant a request reads: `tenant` if given, else the key's own; a tenant key may
/// name only its own tenant.
pub fn target_tenant(principal: &Principal, tenant: Option<&str>) -> Result<String, HttpError> {
    let tenant = tenant.unwrap_or(&principal.tenant);
    principal.authorize_tenant(tenant)?;
    if tenant.is_empty() {
        return Err(HttpError::invalid("tenant", "tenant is required"));
    }
    Ok(tenant.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Role;

    fn key(tenant: &str, role: Role) -> Principal {
        Principal {
            key_id: "k".into(),
            tenant: tenant.into(),
            role,
        }
    }

    #[test]
    fn formats() {
        assert_eq!(parse_format(None).unwrap(), Format::Json);
        assert_eq!(parse_format(Some("json")).unwrap(), Format::Json);
        assert_eq!(parse_format(Some("csv")).unwrap(), Format::Csv);
        for bad in ["CSV", "xml", ""] {
            assert_eq!(parse_format(Some(bad)).unwrap_err().status(), 400, "{bad}");
        }
    }

    #[test]
    fn months() {
        assert_eq!(parse_month(Some("2026-11")).unwrap().to_string(), "2026-11");
        for bad in [
            None,
            Some(""),
            Some("2026-13"),
            Some("2026-1x"),
            Some("november"),
        ] {
            let e = parse_month(bad).unwrap_err();
            assert_eq!(
                (e.status(), e.0.param.as_deref()),
                (400, Some("month")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tenant_keys_read_only_themselves() {
        let a = key("a", Role::Tenant);
        assert_eq!(target_tenant(&a, None).unwrap(), "a");
        assert_eq!(target_tenant(&a, Some("a")).unwrap(), "a");
        for other in ["b", "", "A", "a ", "%"] {
            assert_eq!(
                target_tenant(&a, Some(other)).unwrap_err().status(),
                403,
                "{other:?}"
            );
        }
        let admin = key("ops", Role::Admin);
        assert_eq!(target_tenant(&admin, None).unwrap(), "ops");
        assert_eq!(target_tenant(&admin, Some("b")).unwrap(), "b");
        assert_eq!(
            target_tenant(&Principal::operator(), None)
                .unwrap_err()
                .status(),
            400
        );
    }
}
