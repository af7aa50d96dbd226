//! A Model that joins a pool, against kube's mock API service: its own Deployments are
//! deleted, it stays published to the gateway, and its status names the pool.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kube::runtime::controller::Action;
use tidal_controller::deployment::{build, WorkerConfig};
use tidal_controller::reconcile::reconcile;
use tidal_crds::{Capacity, Resources};
use tidal_queue::{Broker, CapacityType, ModelState};

const ID: &str = "default/qwen-0-5b";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";

#[tokio::test]
async fn a_model_switching_into_a_pool_loses_its_deployments_and_stays_published() {
    let mut h = Harness::new().await;
    let own = model("small", true);
    let cfg = WorkerConfig {
        queue_url: "redis://redis:6379".into(),
        key_prefix: None,
    };
    for cap in [CapacityType::Spot, CapacityType::OnDemand] {
        h.add_deployment(build(&own, &own.spec.source().unwrap(), cap, 1, &cfg));
    }
    // the operator moves it into a pool, dropping what only its own fleet used
    let mut pooled = own.clone();
    pooled.spec.pool = Some("cpu-pool".into());
    pooled.spec.resources = Resources::default();
    pooled.spec.capacity = Capacity::default();
    pooled.metadata.generation = Some(2);
    let m = Arc::new(pooled);

    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    for suffix in ["spot", "ondemand"] {
        let r = next(&mut h.handle).await;
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            (
                "DELETE",
                format!("{DEPLOYMENTS}/qwen-0-5b-{suffix}").as_str()
            )
        );
        assert_eq!(r.body["propagationPolicy"], "Background");
        r.reply(200, &status_error(200, "Success"));
    }
    let r = next(&mut h.handle).await;
    assert_eq!(r.method, "PATCH");
    assert_eq!(
        r.path,
        "/apis/tidal.dev/v1alpha1/namespaces/default/models/qwen-0-5b/status"
    );
    let status = r.body["status"].clone();
    r.reply(200, &serde_json::to_value(m.as_ref()).unwrap());
    assert_eq!(
        task.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(2))
    );
    assert_eq!(status["phase"], "ScaledToZero");
    assert_eq!(status["conditions"][0]["type"], "ServedByPool");
    assert_eq!(status["conditions"][0]["reason"], "PoolNotFound");
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;

    // routing, admission and billing read the same record as before
    let record = h.broker.model(ID).await.unwrap().unwrap();
    assert_eq!(record.state, ModelState::ScaledToZero);
    assert_eq!(record.prices.output_per_mtok_micros, 80_000);
    assert_eq!(record.max_queue_wait_ms, 120_000);
    assert_eq!(h.ledger.price_versions(Some(ID)).await.unwrap().len(), 1);
}
