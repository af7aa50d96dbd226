//! Tidal's CRDs on the test cluster: installed as the chart installs them (server-side
//! apply), and waited for until the API server serves them.

// each test binary uses part of it
#![allow(dead_code)]

use std::time::Duration;

use tidal_controller::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use tidal_controller::kube::api::{Api, Patch, PatchParams};
use tidal_controller::kube::Client;

use crate::process::eventually;

/// Waits until the CRD `name` is `Established`.
pub async fn wait_established(client: &Client, name: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually(
        &format!("the CRD {name} established"),
        Duration::from_secs(60),
        || {
            let crds = crds.clone();
            async move {
                let crd = crds.get(name).await.ok()?;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            }
        },
    )
    .await;
}

/// Applies both CRDs, `Model` and `ModelPool`, as field manager `manager`, and waits until
/// they are established (the controller watches both).
pub async fn apply_crds(client: &Client, manager: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (name, crd) in [
        ("models.tidal.dev", tidal_crds::crd()),
        ("modelpools.tidal.dev", tidal_crds::pool_crd()),
    ] {
        crds.patch(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(crd),
        )
        .await
        .unwrap_or_else(|e| panic!("apply the CRD {name}: {e}"));
        wait_established(client, name).await;
    }
}
