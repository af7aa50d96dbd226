//! The chart's RBAC on a real API server, for tests that run `tidal controller` with exactly
//! the permissions a Helm install gives it (no more: the test's admin credentials stay out).
//!
//! [`ChartRbac::install`] renders the chart (through `chart_common`'s renderer) as release
//! `tidal` in the test's namespace, server-side applies its controller ServiceAccount, Roles,
//! ClusterRoles and bindings as the admin, and writes a kubeconfig that impersonates that
//! ServiceAccount (the kubeconfig user's `as: system:serviceaccount:<ns>:<sa>`, which kube-rs
//! sends as the `Impersonate-User` header). Point the controller at it:
//!
//! ```ignore
//! let admin = Client::try_default().await?;
//! let Some(rbac) = ChartRbac::install(&admin, &ns, &json!({})).await? else {
//!     return; // Helm cannot render here; install() recorded the skip
//! };
//! Command::new(env!("CARGO_BIN_EXE_tidal"))
//!     .env("KUBECONFIG", rbac.kubeconfig())
//!     .args(["controller", "--namespace", &ns, "--lease-namespace", &ns])
//!     .args(["--lease-name", &rbac.lease_name])
//!     // ...
//! let as_controller: Client = rbac.client().await?; // the same identity, for checks
//! ```
//!
//! The namespace must exist first. The namespaced objects go with the namespace; the
//! cluster-scoped ones (ClusterRole and ClusterRoleBinding, named after the namespace) are
//! deleted on drop. [`apply`] is the server-side apply used here, for any kind the server
//! knows (also with `dryRun=All`). The test crate declares `mod chart_common; mod skip;`.

#![allow(dead_code)]

use std::path::Path;

use anyhow::{anyhow, Context as _};
use serde_json::{json, Value};
use tidal_controller::kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use tidal_controller::kube::config::{KubeConfigOptions, Kubeconfig};
use tidal_controller::kube::discovery::{self, Scope};
use tidal_controller::kube::{Client, Config};

use crate::chart_common::{self, Manifest};

/// Field manager of what this module applies.
pub const MANAGER: &str = "tidal-test-chart";
/// Release name the chart is rendered as.
pub const RELEASE: &str = "tidal";
/// The kinds [`ChartRbac::install`] applies.
pub const RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
];

/// The chart's controller identity in one namespace; see the module docs.
pub struct ChartRbac {
    /// The release namespace (also the watched namespace, unless the values say otherwise).
    pub namespace: String,
    /// The controller's ServiceAccount (`<fullname>-controller`).
    pub service_account: String,
    /// The user the kubeconfig impersonates: `system:serviceaccount:<ns>:<sa>`.
    pub user: String,
    /// The Lease the chart lets the controller read and renew (pass as `--lease-name`).
    pub lease_name: String,
    /// The RBAC objects applied, as rendered.
    pub manifests: Vec<Manifest>,
    kubeconfig: tempfile::NamedTempFile,
    admin: Client,
}

impl ChartRbac {
    /// Renders the chart for `namespace` with `values` (coalesced over
    /// `ci/minimal-values.yaml`, which names the ledger and Redis), applies its controller
    /// RBAC and writes the impersonating kubeconfig. `Ok(None)` after recording a skip when
    /// Helm cannot render here.
    pub async fn install(
        admin: &Client,
        namespace: &str,
        values: &Value,
    ) -> anyhow::Result<Option<ChartRbac>> {
        let test = std::thread::current().name().unwrap_or("?").to_owned();
        let Some(renderer) = chart_common::renderer_or_skip(&test) else {
            return Ok(None);
        };
        let mut merged = chart_common::ci_values("minimal-values.yaml");
        chart_common::coalesce(&mut merged, values);
        let manifests: Vec<Manifest> =
            chart_common::render_release(&renderer, &merged, RELEASE, namespace)
                .map_err(|e| anyhow!("helm refused to render: {e}"))?
                .into_iter()
                .filter(|m| RBAC_KINDS.contains(&m.kind.as_str()))
                .filter(|m| {
                    m.doc["metadata"]["labels"]["app.kubernetes.io/component"] == "controller"
                })
                .collect();
        let service_account = manifests
            .iter()
            .find(|m| m.kind == "ServiceAccount")
            .map(|m| m.name.clone())
            .context("the chart renders no controller ServiceAccount")?;
        // The leader-election Role names the one Lease it may read and renew.
        let lease_name = manifests
            .iter()
            .flat_map(|m| m.doc["rules"].as_array().cloned().unwrap_or_default())
            .find(|r| r["resources"] == json!(["leases"]) && r["resourceNames"].is_array())
            .and_then(|r| r["resourceNames"][0].as_str().map(str::to_string))
            .context("the chart grants no named Lease")?;
        for m in &manifests {
            apply(admin, &m.doc, namespace, false)
                .await
                .with_context(|| format!("apply {} {}", m.kind, m.name))?;
        }
        let user = format!("system:serviceaccount:{namespace}:{service_account}");
        let kubeconfig = impersonating_kubeconfig(&user, namespace)?;
        Ok(Some(ChartRbac {
            namespace: namespace.to_string(),
            service_account,
            user,
            lease_name,
            manifests,
            kubeconfig,
            admin: admin.clone(),
        }))
    }

    /// The kubeconfig that acts as the controller's ServiceAccount (its default namespace is
    /// the release namespace).
    pub fn kubeconfig(&self) -> &Path {
        self.kubeconfig.path()
    }

    /// A client acting as the controller's ServiceAccount.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig())?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// The rules of the rendered Role or ClusterRole `name`.
    pub fn rules(&self, kind: &str, name: &str) -> Vec<Value> {
        self.manifests
            .iter()
            .find(|m| m.kind == kind && m.name == name)
            .and_then(|m| m.doc["rules"].as_array().cloned())
            .unwrap_or_default()
    }

    fn cluster_scoped(&self) -> Vec<(String, String)> {
        self.manifests
            .iter()
            .filter(|m| m.kind.starts_with("Cluster"))
            .map(|m| (m.kind.clone(), m.name.clone()))
            .collect()
    }
}

impl Drop for ChartRbac {
    fn drop(&mut self) {
        let objects = self.cluster_scoped();
        let admin = self.admin.clone();
        // The test's runtime may be shutting down: delete from a runtime of our own.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                for (kind, name) in objects {
                    let api = api_for(&admin, "rbac.authorization.k8s.io/v1", &kind, None).await?;
                    let _ = api.delete(&name, &DeleteParams::default()).await;
                }
                anyhow::Ok(())
            })
        })
        .join();
        if !matches!(done, Ok(Ok(()))) {
            eprintln!(
                "chart-rbac: could not delete the cluster-scoped RBAC of {}",
                self.namespace
            );
        }
    }
}

/// An `Api` for `kind` of `api_version`, found through discovery; `namespace` is used when
/// the kind is namespaced.
pub async fn api_for(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> anyhow::Result<Api<DynamicObject>> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("the API server does not serve {api_version} {kind}"))?;
    Ok(match (caps.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    })
}

/// Server-side applies `doc` (field manager [`MANAGER`], forcing conflicts) in its own
/// `metadata.namespace`, else `namespace` when its kind is namespaced; with `dry_run`, as
/// `dryRun=All` (validated and admitted, not stored).
pub async fn apply(
    client: &Client,
    doc: &Value,
    namespace: &str,
    dry_run: bool,
) -> anyhow::Result<DynamicObject> {
    let api_version = doc["apiVersion"].as_str().context("no apiVersion")?;
    let kind = doc["kind"].as_str().context("no kind")?;
    let name = doc["metadata"]["name"]
        .as_str()
        .context("no metadata.name")?;
    let ns = doc["metadata"]["namespace"].as_str().unwrap_or(namespace);
    let api = api_for(client, api_version, kind, Some(ns)).await?;
    let mut params = PatchParams::apply(MANAGER).force();
    params.dry_run = dry_run;
    Ok(api.patch(name, &params, &Patch::Apply(doc)).await?)
}

/// The current kubeconfig (`$KUBECONFIG`) with every user impersonating `user` and
/// `namespace` as the default namespace, in a temporary file.
fn impersonating_kubeconfig(
    user: &str,
    namespace: &str,
) -> anyhow::Result<tempfile::NamedTempFile> {
    let mut config = Kubeconfig::read().context("reading $KUBECONFIG")?;
    for auth in &mut config.auth_infos {
        if let Some(info) = auth.auth_info.as_mut() {
            info.impersonate = Some(user.to_string());
        }
    }
    for context in &mut config.contexts {
        if let Some(c) = context.context.as_mut() {
            c.namespace = Some(namespace.to_string());
        }
    }
    let file = tempfile::Builder::new()
        .prefix("tidal-impersonate-")
        .suffix(".kubeconfig")
        .tempfile()?;
    std::fs::write(file.path(), serde_yaml::to_string(&config)?)?;
    Ok(file)
}
