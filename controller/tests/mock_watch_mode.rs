//! The streaming-list probe: a server that refuses `sendInitialEvents` gets plain lists.

mod common;

use common::*;
use http::{Request, Response};
use kube::api::Api;
use kube::client::Body;
use kube::Client;
use serde_json::json;
use tidal_controller::watch_mode::{config, supports_streaming_lists};
use tidal_crds::Model;

fn api() -> (Api<Model>, std::pin::Pin<Box<MockHandle>>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (
        Api::namespaced(Client::new(service, "default"), "default"),
        Box::pin(handle),
    )
}

#[tokio::test]
async fn refused_streaming_lists_fall_back_to_lists() {
    let (api, mut handle) = api();
    let task = tokio::spawn(async move { supports_streaming_lists(&api).await });
    let r = next(&mut handle).await;
    assert_eq!(r.method, "GET");
    assert_eq!(r.path, "/apis/tidal.dev/v1alpha1/namespaces/default/models");
    let q = r.query_pairs();
    assert!(q.contains(&("watch", "true")), "{q:?}");
    assert!(q.contains(&("sendInitialEvents", "true")), "{q:?}");
    r.reply(422, &status_error(422, "Invalid"));
    assert!(!task.await.unwrap());
}

#[tokio::test]
async fn accepted_streaming_lists_are_used() {
    let (api, mut handle) = api();
    let task = tokio::spawn(async move { supports_streaming_lists(&api).await });
    let r = next(&mut handle).await;
    let bookmark = json!({
        "type": "BOOKMARK",
        "object": {
            "apiVersion": "tidal.dev/v1alpha1", "kind": "Model",
            "metadata": {"resourceVersion": "5", "annotations": {"k8s.io/initial-events-end": "true"}}
        }
    });
    r.reply(200, &bookmark);
    assert!(task.await.unwrap());
    assert_eq!(
        config(true).initial_list_strategy,
        kube::runtime::watcher::InitialListStrategy::StreamingList
    );
    assert_eq!(
        config(false).initial_list_strategy,
        kube::runtime::watcher::InitialListStrategy::ListWatch
    );
}
