//! Who may read what: a tenant key reads only its own tenant; an admin key reads all.

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads and spends only its own tenant.
    Tenant,
    /// Reads every tenant and the platform view; issues invoices.
    Admin,
}

impl Role {
    /// Stable name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Tenant => "tenant",
            Role::Admin => "admin",
        }
    }

    /// Parses [`Role::as_str`] output.
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "tenant" => Ok(Role::Tenant),
            "admin" => Ok(Role::Admin),
            other => Err(Error::Corrupt(format!("unknown role {other:?}"))),
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// The key's id.
    pub key_id: String,
    /// The key's tenant.
    pub tenant: String,
    /// The key's role.
    pub role: Role,
}

impl Principal {
    /// A principal for trusted local callers (the CLI on the ledger's own machine).
    pub fn operator() -> Self {
        Principal {
            key_id: "operator".into(),
            tenant: String::new(),
            role: Role::Admin,
        }
    }

    /// Allows reading `tenant`'s data.
    pub fn authorize_tenant(&self, tenant: &str) -> Result<(), Error> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Tenant if self.tenant == tenant => Ok(()),
            Role::Tenant => Err(Error::Forbidden(format!(
                "key {} may not read tenant {tenant:?}",
                self.key_id
            ))),
        }
    }

    /// Allows admin-only operations.
    pub fn authorize_admin(&self) -> Result<(), Error> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Tenant => Err(Error::Forbidden(format!(
                "key {} is not an admin key",
                self.key_id
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_reads_only_itself_admin_reads_all() {
        let t = Principal {
            key_id: "k".into(),
            tenant: "a".into(),
            role: Role::Tenant,
        };
        assert!(t.authorize_tenant("a").is_ok());
        assert!(matches!(t.authorize_tenant("b"), Err(Error::Forbidden(_))));
        assert!(matches!(t.authorize_tenant(""), Err(Error::Forbidden(_))));
        assert!(matches!(t.authorize_admin(), Err(Error::Forbidden(_))));
        let a = Principal {
            role: Role::Admin,
            ..t
        };
        assert!(a.authorize_tenant("a").is_ok());
        assert!(a.authorize_tenant("b").is_ok());
        assert!(a.authorize_admin().is_ok());
        assert!(Principal::operator().authorize_admin().is_ok());
    }

    #[test]
    fn role_round_trips() {
        for r in [Role::Tenant, Role::Admin] {
            assert_eq!(Role::parse(r.as_str()).unwrap(), r);
        }
        assert!(Role::parse("root").is_err());
    }
}
