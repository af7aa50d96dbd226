//! Leader election against kube's mock API service: create when missing, leave a live
//! holder alone, take a lease whose holder stopped renewing, lose a race on 409, renew.

mod common;

use std::time::Duration;

use common::*;
use http::{Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tidal_controller::leader::{LeaderElector, LeaseConfig};

const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/tidal/leases/tidal-controller";

fn elector() -> (LeaderElector, std::pin::Pin<Box<MockHandle>>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    (
        LeaderElector::new(client, LeaseConfig::new("tidal-controller", "tidal", "me")),
        Box::pin(handle),
    )
}

fn lease(holder: &str, renew: &str, rv: &str, transitions: i32) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "tidal-controller", "namespace": "tidal", "resourceVersion": rv},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-11-30T11:00:00.000000Z",
            "renewTime": renew,
            "leaseTransitions": transitions
        }
    })
}

#[tokio::test]
async fn creates_a_missing_lease_and_leads() {
    let (mut e, mut handle) = elector();
    let task = tokio::spawn(async move { e.try_acquire_or_renew().await.map(|ok| (ok, e)) });
    let r = next(&mut handle).await;
    assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", PATH));
    r.reply(404, &status_error(404, "NotFound"));
    let r = next(&mut handle).await;
    assert_eq!(r.method, "POST");
    assert_eq!(
        r.path,
        "/apis/coordination.k8s.io/v1/namespaces/tidal/leases"
    );
    assert_eq!(r.body["metadata"]["name"], "tidal-controller");
    assert_eq!(r.body["spec"]["holderIdentity"], "me");
    assert_eq!(r.body["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(r.body["spec"]["leaseTransitions"], 0);
    assert!(r.body["spec"]["renewTime"].is_string());
    assert!(r.body["spec"]["acquireTime"].is_string());
    let mut created = r.body.clone();
    created["metadata"]["resourceVersion"] = json!("1");
    r.reply(201, &created);
    let (ok, _) = task.await.unwrap().unwrap();
    assert!(ok);
}

#[tokio::test]
async fn losing_the_create_race_does_not_lead() {
    let (mut e, mut handle) = elector();
    let task = tokio::spawn(async move { e.try_acquire_or_renew().await });
    next(&mut handle)
        .await
        .reply(404, &status_error(404, "NotFound"));
    let r = next(&mut handle).await;
    assert_eq!(r.method, "POST");
    r.reply(409, &status_error(409, "AlreadyExists"));
    assert!(!task.await.unwrap().unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_live_holder_keeps_the_lease_and_a_silent_one_loses_it() {
    let (mut e, mut handle) = elector();
    // first look: held by someone else, renewed "now" as far as we know
    let held = lease("other", "2026-11-30T12:00:00.000000Z", "10", 3);
    let task = tokio::spawn(async move { e.try_acquire_or_renew().await.map(|ok| (ok, e)) });
    let r = next(&mut handle).await;
    assert_eq!(r.method, "GET");
    r.reply(200, &held);
    let (ok, mut e) = task.await.unwrap().unwrap();
    assert!(!ok, "a fresh holder keeps the lease");
    assert_quiet(&mut handle, Duration::from_millis(10)).await;

    // 10 s later the holder renewed: still theirs
    tokio::time::advance(Duration::from_secs(10)).await;
    let renewed = lease("other", "2026-11-30T12:00:10.000000Z", "11", 3);
    let task = tokio::spawn(async move { e.try_acquire_or_renew().await.map(|ok| (ok, e)) });
    next(&mut handle).await.reply(200, &renewed);
    let (ok, mut e) = task.await.unwrap().unwrap();
    assert!(!ok);

    // 14 s without a change: not yet
    tokio::time::advance(Duration::from_secs(14)).await;
    let task = tokio::spawn(async move { e.try_acquire_or_renew().await.map(|ok| (ok, e)) });
    next(&mut handle).await.reply(200, &renewed);
    let (ok, mut e) = task.await.unwrap().unwrap();
    assert!(!ok);

    // 15 s without a change (on our clock): we take it with its resourceVersion
    tokio::time::advance(Duration::from_secs(1)).await;
    let task = tokio::spawn(async move { e.try_acquire_or_renew().await.map(|ok| (ok, e)) });
    next(&mut handle).await.reply(200, &renewed);
    let r = next(&mut handle).await;
    assert_eq!((r.method.as_str(), r.path.as_str()), ("PUT", PATH));
    assert_eq!(r.body["metadata"]["resourceVersion"], "11");
    assert_eq!(r.body["spec"]["holderIdentity"], "me");
    assert_eq!(r.body["spec"]["leaseTransitions"], 4);
    assert_ne!(r.body["spec"]["acquireTime"], "2026-11-30T11:00:00.000000Z");
    let mut written = r.body.clone();
    written["metadata"]["resourceVersion"] = json!("12");
    r.reply(200, &written);
    let (ok, mut e) = task.await.unwrap().unwrap();
    assert!(ok);

    // renewing our own lease keeps acquireTime and the transition count
    let task = tokio::spawn(async move { e.try_acquire_or_renew().await });
    next(&mut handle).await.reply(200, &written);
    let r = next(&mut handle).await;
    assert_eq!(r.method, "PUT");
    assert_eq!(r.body["metadata"]["resourceVersion"], "12");
    assert_eq!(r.body["spec"]["leaseTransitions"], 4);
    assert_eq!(
        r.body["spec"]["acquireTime"],
        written["spec"]["acquireTime"]
    );
    let reply = r.body.clone();
    r.reply(200, &reply);
    assert!(task.await.unwrap().unwrap());
}

#[tokio::test]
async fn a_free_lease_is_taken_and_a_conflict_loses() {
    let (mut e, mut handle) = elector();
    let mut free = lease("", "2026-11-30T12:00:00.000000Z", "20", 7);
    free["spec"]["holderIdentity"] = Value::Null;
    let task = tokio::spawn(async move { e.try_acquire_or_renew().await });
    next(&mut handle).await.reply(200, &free);
    let r = next(&mut handle).await;
    assert_eq!(r.method, "PUT");
    assert_eq!(r.body["spec"]["holderIdentity"], "me");
    assert_eq!(r.body["spec"]["leaseTransitions"], 8);
    r.reply(409, &status_error(409, "Conflict"));
    assert!(!task.await.unwrap().unwrap());
}

#[tokio::test]
async fn release_clears_the_holder() {
    let (mut e, mut handle) = elector();
    let ours = lease("me", "2026-11-30T12:00:00.000000Z", "30", 1);
    let task = tokio::spawn(async move { e.release().await });
    next(&mut handle).await.reply(200, &ours);
    let r = next(&mut handle).await;
    assert_eq!(r.method, "PUT");
    assert_eq!(r.body["spec"].get("holderIdentity"), None);
    assert_eq!(r.body["spec"]["leaseDurationSeconds"], 1);
    let reply = r.body.clone();
    r.reply(200, &reply);
    task.await.unwrap().unwrap();
}
