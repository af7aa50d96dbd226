//! Events against kube's mock API service: each different message is an Event of its own,
//! the same message repeated continues its own Event as a series, and a series ends after
//! its time to live.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use kube::Resource;
use serde_json::Value;
use tidal_controller::events::SERIES_TTL;
use tidal_controller::report::Notice;

const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

fn scaled_up(note: &str) -> Notice {
    Notice {
        reason: "ScaledUp",
        note: note.into(),
        warning: false,
    }
}

/// Publishes `notice` at `at` and answers its request (the API echoes what it was sent);
/// returns (method, path, body).
async fn publish(h: &mut Harness, notice: &Notice, at: SystemTime) -> (String, String, Value) {
    let m = model("small", true);
    let regarding = m.object_ref(&());
    let events = &h.ctx.events;
    let (sent, seen) = tokio::join!(events.publish(notice, "Scale", &regarding, at), async {
        let r = next(&mut h.handle).await;
        let seen = (r.method.clone(), r.path.clone(), r.body.clone());
        let body = r.body.clone();
        let code = if r.method == "POST" { 201 } else { 200 };
        r.reply(code, &body);
        seen
    });
    sent.unwrap();
    seen
}

#[tokio::test]
async fn each_transition_is_an_event_with_its_own_message() {
    let mut h = Harness::new().await;
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(T0);
    let notes = [
        "serving replicas 0 -> 1 (activation; spot 0, on-demand 1)",
        "serving replicas 1 -> 2 (panic; spot 0, on-demand 2)",
        "serving replicas 2 -> 3 (max-replicas; spot 0, on-demand 3)",
    ];
    let mut names = Vec::new();
    for (i, note) in notes.iter().enumerate() {
        let at = t0 + Duration::from_secs(10 * i as u64);
        let (method, path, body) = publish(&mut h, &scaled_up(note), at).await;
        assert_eq!((method.as_str(), path.as_str()), ("POST", EVENTS));
        assert_eq!(body["reason"], "ScaledUp");
        assert_eq!(body["note"], *note);
        assert_eq!(body["action"], "Scale");
        assert_eq!(body["type"], "Normal");
        assert_eq!(body["regarding"]["kind"], "Model");
        assert_eq!(body["regarding"]["name"], "qwen-0-5b");
        assert_eq!(body["reportingController"], "tidal-controller");
        assert_eq!(body.get("series"), None);
        names.push(body["metadata"]["name"].as_str().unwrap().to_string());
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3, "{names:?}");

    // the second transition again: its own Event continues as a series, with its message
    let at = t0 + Duration::from_secs(40);
    let (method, path, body) = publish(&mut h, &scaled_up(notes[1]), at).await;
    assert_eq!(method, "PATCH");
    assert_eq!(
        path,
        format!("{EVENTS}/{}", body["metadata"]["name"].as_str().unwrap())
    );
    assert_eq!(body["note"], notes[1]);
    assert_eq!(body["series"]["count"], 2);
    assert_eq!(
        body["series"]["lastObservedTime"],
        "2026-11-30T12:00:40.000000Z"
    );
    let (method, _, body) =
        publish(&mut h, &scaled_up(notes[1]), at + Duration::from_secs(1)).await;
    assert_eq!(method, "PATCH");
    assert_eq!(body["series"]["count"], 3);
    assert_eq!(body["note"], notes[1]);

    // a Warning with the same reason and note is another Event
    let warning = Notice {
        warning: true,
        ..scaled_up(notes[1])
    };
    let (method, _, body) = publish(&mut h, &warning, at + Duration::from_secs(2)).await;
    assert_eq!(
        (method.as_str(), body["type"].as_str()),
        ("POST", Some("Warning"))
    );

    // past the series' time to live: a new Event
    let later = at + Duration::from_secs(1) + SERIES_TTL;
    let (method, _, body) = publish(&mut h, &scaled_up(notes[1]), later).await;
    assert_eq!(method, "POST");
    assert_eq!(body.get("series"), None);
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
}

#[tokio::test]
async fn events_at_the_same_instant_get_distinct_names() {
    let mut h = Harness::new().await;
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(T0);
    let (_, _, a) = publish(&mut h, &scaled_up("serving replicas 0 -> 1"), at).await;
    let spot = Notice {
        reason: "SpotFallback",
        note: "1 on-demand replicas stand in for pending or interrupted spot replicas".into(),
        warning: true,
    };
    let (_, _, b) = publish(&mut h, &spot, at).await;
    assert_ne!(a["metadata"]["name"], b["metadata"]["name"]);
    assert_eq!(a["eventTime"], b["eventTime"]);
}

#[tokio::test]
async fn a_failed_patch_starts_a_new_event_next_time() {
    let mut h = Harness::new().await;
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(T0);
    let notice = scaled_up("serving replicas 0 -> 1");
    let (method, _, _) = publish(&mut h, &notice, at).await;
    assert_eq!(method, "POST");
    // the Event expired in the API: the series patch gets a 404
    let m = model("small", true);
    let regarding = m.object_ref(&());
    let (sent, ()) = tokio::join!(
        h.ctx
            .events
            .publish(&notice, "Scale", &regarding, at + Duration::from_secs(1)),
        async {
            let r = next(&mut h.handle).await;
            assert_eq!(r.method, "PATCH");
            r.reply(404, &status_error(404, "NotFound"));
        }
    );
    assert!(sent.is_err());
    let (method, _, body) = publish(&mut h, &notice, at + Duration::from_secs(2)).await;
    assert_eq!(method, "POST");
    assert_eq!(body.get("series"), None);
}
