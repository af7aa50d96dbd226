//! The pod statuses the simulated kubelet writes (`pods/status`, as JSON merge patches):
//! containers being created, then running and Ready.

use serde_json::{json, Value};
use tidal_controller::k8s_openapi::api::core::v1::{Container, Pod};
use tidal_controller::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tidal_controller::k8s_openapi::jiff::Timestamp;

use super::PodInfo;

/// Now, as the API writes times.
pub fn now() -> Value {
    serde_json::to_value(Time(Timestamp::now())).unwrap_or(Value::Null)
}

fn condition(kind: &str, ready: bool, reason: Option<&str>) -> Value {
    json!({"type": kind, "status": if ready { "True" } else { "False" }, "reason": reason,
           "lastTransitionTime": now(), "lastProbeTime": null})
}

/// The `PodScheduled` condition the binding wrote, kept as it is (a merge patch replaces the
/// whole list).
fn scheduled(pod: &Pod) -> Value {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .unwrap_or_else(|| condition("PodScheduled", true, None))
}

fn container_id(uid: &str, i: usize) -> String {
    format!("containerd://{}{i:02}", uid.replace('-', ""))
}

/// Status of a pod whose containers are being created (image pull, init containers).
pub fn creating_status(pod: &Pod, info: &PodInfo, host: &str) -> Value {
    let spec = pod.spec.clone().unwrap_or_default();
    let has_init = spec.init_containers.as_ref().is_some_and(|c| !c.is_empty());
    let waiting = |reason: &'static str| {
        move |c: &Container| {
            json!({"name": c.name, "image": c.image, "imageID": "", "ready": false, "started": false,
                   "restartCount": 0, "state": {"waiting": {"reason": reason}}})
        }
    };
    let init: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(waiting("PodInitializing"))
        .collect();
    let main_reason = if has_init {
        "PodInitializing"
    } else {
        "ContainerCreating"
    };
    let containers: Vec<Value> = spec.containers.iter().map(waiting(main_reason)).collect();
    json!({"status": {
        "phase": "Pending",
        "hostIP": host, "hostIPs": [{"ip": host}],
        "podIP": info.ip, "podIPs": [{"ip": info.ip}],
        "startTime": now(),
        "conditions": [
            condition("PodReadyToStartContainers", true, None),
            condition("Initialized", !has_init, has_init.then_some("ContainersNotInitialized")),
            condition("Ready", false, Some("ContainersNotReady")),
            condition("ContainersReady", false, Some("ContainersNotReady")),
            scheduled(pod),
        ],
        "initContainerStatuses": init,
        "containerStatuses": containers,
    }})
}

/// Status of a pod whose init containers completed and whose containers run and are Ready.
pub fn ready_status(pod: &Pod, info: &PodInfo) -> Value {
    let spec = pod.spec.clone().unwrap_or_default();
    let t = now();
    let image_id = |image: &Option<String>| format!("sim://{}", image.as_deref().unwrap_or(""));
    let init: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let id = container_id(&info.uid, 50 + i);
            json!({"name": c.name, "image": c.image, "imageID": image_id(&c.image), "containerID": id,
                   "ready": true, "started": false, "restartCount": 0,
                   "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": t,
                                            "finishedAt": t, "containerID": id}}})
        })
        .collect();
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"name": c.name, "image": c.image, "imageID": image_id(&c.image),
                   "containerID": container_id(&info.uid, i), "ready": true, "started": true,
                   "restartCount": 0, "state": {"running": {"startedAt": t}}})
        })
        .collect();
    json!({"status": {
        "phase": "Running",
        "conditions": [
            condition("PodReadyToStartContainers", true, None),
            condition("Initialized", true, None),
            condition("Ready", true, None),
            condition("ContainersReady", true, None),
            scheduled(pod),
        ],
        "initContainerStatuses": init,
        "containerStatuses": containers,
    }})
}
