//! Whether the API server offers streaming lists (`sendInitialEvents`, the WatchList
//! feature): the watchers use them where offered and paginated lists otherwise.
//!
//! There is no discovery flag for it. A server without the feature rejects a watch that asks
//! for initial events (422 Invalid / 400); one with it answers with a stream. So the
//! controller asks once at start, on its own Model resource.

use futures::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::runtime::watcher;
use tidal_crds::Model;

/// Probes `api` with a one-second streaming-list watch; true when the server accepts it.
pub async fn supports_streaming_lists(api: &Api<Model>) -> bool {
    let params = WatchParams::streaming_lists().timeout(1);
    match api.watch(&params, "0").await {
        Ok(stream) => {
            let mut stream = Box::pin(stream);
            match stream.next().await {
                Some(Ok(WatchEvent::Error(e))) => {
                    tracing::info!(code = e.code, reason = %e.reason, "streaming lists refused; using lists");
                    false
                }
                Some(Err(e)) => {
                    tracing::info!(error = %e, "streaming lists failed; using lists");
                    false
                }
                Some(Ok(_)) | None => true,
            }
        }
        Err(e) => {
            tracing::info!(error = %e, "streaming lists unsupported; using lists");
            false
        }
    }
}

/// A watcher configuration with the initial-list strategy the server supports.
pub fn config(streaming: bool) -> watcher::Config {
    let c = watcher::Config::default().any_semantic();
    if streaming {
        c.streaming_lists()
    } else {
        c
    }
}
