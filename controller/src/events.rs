//! Kubernetes Events about Models (`events.k8s.io/v1`), so that `kubectl describe model`
//! shows each change as what it was.
//!
//! kube-runtime's `Recorder` continues an event as a series (`ScaledUp (x3 over 31s)` in
//! `kubectl describe`) whenever type, reason, action, reporter and object match, and the
//! series keeps the first event's note: a Model scaled 0 → 1, 1 → 2 (panic) and 2 → 3 within
//! six minutes read `serving replicas 0 -> 1 (activation ...)` three times. Here the note is
//! part of that key: only the same message repeated becomes a series, so `(xN)` means the
//! same thing happened N times, and each different transition is a line of its own with its
//! own message. Distinct reasons per kind of change (`ScaledUpPanic`, ...) would not be
//! enough: two panic steps (1 → 2, then 2 → 4) would still fold into the first one's text.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;

use crate::report::Notice;

/// How long after its last occurrence an event can still be continued as a series (as
/// kube-runtime's recorder and client-go's event broadcaster do).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// The API's limit on an event's note, in bytes.
const MAX_NOTE: usize = 1024;

/// What makes two events the same occurrence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    warning: bool,
    reason: &'static str,
    action: &'static str,
    note: String,
}

/// An event already in the API and when it last occurred.
#[derive(Debug)]
struct Published {
    event: Event,
    last: SystemTime,
}

#[derive(Debug, Default)]
struct State {
    published: HashMap<Key, Published>,
    /// The last event name's time part, in nanoseconds: names stay unique when two events
    /// share a clock reading.
    last_nanos: i128,
}

/// Publishes the controller's Events, as one reporting controller.
pub struct Events {
    client: Client,
    controller: String,
    instance: Option<String>,
    state: Mutex<State>,
}

impl Events {
    /// Events reported as `controller` (and `instance`, the pod, when known).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Events {
            client,
            controller: controller.into(),
            instance,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes `notice` about `regarding` at `now`: a new Event, or the next occurrence of
    /// the same one (same reason and note) within [`SERIES_TTL`].
    pub async fn publish(
        &self,
        notice: &Notice,
        action: &'static str,
        regarding: &ObjectReference,
        now: SystemTime,
    ) -> Result<(), kube::Error> {
        let key = Key {
            namespace: regarding.namespace.clone(),
            name: regarding.name.clone(),
            uid: regarding.uid.clone(),
            warning: notice.warning,
            reason: notice.reason,
            action,
            note: truncate(&notice.note, MAX_NOTE).to_string(),
        };
        let at = MicroTime(timestamp(now));
        let event = {
            let mut state = self.state();
            state
                .published
                .retain(|_, p| now.duration_since(p.last).unwrap_or_default() < SERIES_TTL);
            match state.published.get(&key) {
                Some(p) => {
                    let mut event = p.event.clone();
                    let count = event.series.as_ref().map_or(2, |s| s.count + 1);
                    event.series = Some(EventSeries {
                        count,
                        last_observed_time: at,
                    });
                    event
                }
                None => {
                    let nanos = at.0.as_nanosecond().max(state.last_nanos + 1);
                    state.last_nanos = nanos;
                    self.event(&key, regarding, at, nanos)
                }
            }
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let sent = match (&event.series, event.metadata.name.as_deref()) {
            (Some(_), Some(name)) => api
                .patch(name, &PatchParams::default(), &Patch::Merge(&event))
                .await
                .map(drop),
            _ => api.create(&PostParams::default(), &event).await.map(drop),
        };
        let mut state = self.state();
        match sent {
            Ok(()) => {
                state.published.insert(key, Published { event, last: now });
                Ok(())
            }
            Err(e) => {
                // the next occurrence starts a new Event instead of patching one that may
                // not exist
                state.published.remove(&key);
                Err(e)
            }
        }
    }

    /// Forgets the events about the object with `uid` (it was deleted).
    pub fn forget(&self, uid: &str) {
        self.state()
            .published
            .retain(|k, _| k.uid.as_deref() != Some(uid));
    }

    fn event(&self, key: &Key, regarding: &ObjectReference, at: MicroTime, nanos: i128) -> Event {
        Event {
            action: Some(key.action.into()),
            reason: Some(key.reason.into()),
            note: Some(key.note.clone()),
            type_: Some(if key.warning { "Warning" } else { "Normal" }.into()),
            event_time: Some(at),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(
                self.instance
                    .clone()
                    .unwrap_or_else(|| self.controller.clone()),
            ),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{nanos:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller)
                )),
                ..ObjectMeta::default()
            },
            ..Event::default()
        }
    }
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn notes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("abcd", 3), "abc");
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate(&"x".repeat(2000), super::MAX_NOTE).len(), 1024);
    }
}
