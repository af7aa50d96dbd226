//! `tidal keys`: tenants, API keys, budgets and rate limits, straight in the ledger database
//! (the same operations as the gateway's admin API). Prints JSON.

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use tidal_billing::ledger::RateLimits;
use tidal_billing::{Ledger, Principal, Role};

/// Flags of `tidal keys`.
#[derive(Args, Debug)]
pub struct KeysArgs {
    /// Ledger database: `postgres://...` or `sqlite:PATH`.
    #[arg(long, env = "TIDAL_DATABASE_URL")]
    pub database: String,
    #[command(subcommand)]
    pub command: KeysCommand,
}

/// The operations.
#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a tenant.
    CreateTenant {
        /// Tenant id (`[a-z0-9][a-z0-9_-]*`).
        id: String,
        /// Display name (default: the id).
        #[arg(long)]
        name: Option<String>,
    },
    /// Issue an API key; its secret is printed this once.
    Issue {
        /// Tenant.
        tenant: String,
        /// Make it an admin key of the usage API.
        #[arg(long)]
        admin: bool,
    },
    /// Revoke a key by id.
    Revoke {
        /// Key id (from `issue` or `list`).
        key_id: String,
    },
    /// Set a tenant's rate limits; a limit not given is unlimited.
    SetLimits {
        /// Tenant.
        tenant: String,
        /// Requests per minute.
        #[arg(long)]
        requests_per_min: Option<u64>,
        /// Tokens (prompt + completion) per minute.
        #[arg(long)]
        tokens_per_min: Option<u64>,
    },
    /// Set a tenant's monthly budget in micro-units of the currency.
    SetBudget {
        /// Tenant.
        tenant: String,
        /// Budget in micros (1 USD = 1000000).
        #[arg(
            long,
            conflicts_with = "unlimited",
            required_unless_present = "unlimited"
        )]
        micros: Option<i64>,
        /// Remove the budget.
        #[arg(long)]
        unlimited: bool,
    },
    /// List tenants with budgets and limits (and the keys of one tenant).
    List {
        /// Also list this tenant's keys.
        #[arg(long)]
        tenant: Option<String>,
    },
}

/// Runs one operation.
pub fn run(args: KeysArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(async move {
        let ledger = Ledger::connect(&args.database)
            .await
            .with_context(|| format!("opening ledger {}", args.database))?;
        let now = chrono::Utc::now();
        let out = match args.command {
            KeysCommand::CreateTenant { id, name } => {
                let name = name.unwrap_or_else(|| id.clone());
                json!(ledger.create_tenant(&id, &name, now).await?)
            }
            KeysCommand::Issue { tenant, admin } => {
                let role = if admin { Role::Admin } else { Role::Tenant };
                json!(ledger.issue_key(&tenant, role, now).await?)
            }
            KeysCommand::Revoke { key_id } => {
                ledger.revoke_key(&key_id, now).await?;
                json!({"id": key_id, "revoked": true})
            }
            KeysCommand::SetLimits {
                tenant,
                requests_per_min,
                tokens_per_min,
            } => {
                let limits = RateLimits {
                    requests_per_min,
                    tokens_per_min,
                };
                ledger.set_rate_limits(&tenant, limits).await?;
                json!({"tenant": tenant, "limits": limits})
            }
            KeysCommand::SetBudget {
                tenant,
                micros,
                unlimited,
            } => {
                ledger
                    .set_budget(&tenant, if unlimited { None } else { micros })
                    .await?;
                let status = ledger
                    .budget_status(&Principal::operator(), &tenant, now)
                    .await?;
                json!({"tenant": tenant, "budget": status})
            }
            KeysCommand::List { tenant } => match tenant {
                None => json!(ledger.tenant_settings().await?),
                Some(t) => {
                    let op = Principal::operator();
                    json!({
                        "tenant": ledger.tenant(&op, &t).await?,
                        "limits": ledger.rate_limits(&t).await?,
                        "budget": ledger.budget_status(&op, &t, now).await?,
                        "keys": ledger.list_keys(&op, &t).await?,
                    })
                }
            },
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        ledger.close().await;
        anyhow::Ok(())
    })
}
