//! What the fleet looks like to the policy (pure): a Model's pods and the nodes they run on,
//! summarised per capacity type into the policy's [`CapacityObserved`].
//!
//! A pod not yet bound to a node is *pending* (its creation time feeds the spot fallback
//! delay); a bound pod that is not Ready is *starting*; a Ready pod on a node without an
//! interruption signal is *ready*. Pods on nodes with an interruption signal (Karpenter,
//! GKE, AWS node-termination-handler taints, or a termination node condition) count as
//! *interrupted* and never as ready, so the policy replaces them before they go. Pods being
//! deleted are neither: they drain and leave, but are still *scheduled* (they cost money).
//!
//! A ready pod's *cold start* is the time from its creation to its `Ready` condition: node
//! provisioning, scheduling, image pull, weight download and model load, all that a request
//! waits for when it arrives at a fleet too small for it.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Node, Pod};
use tidal_autoscaler::{condition_signal, taint_signal, CapacityObserved};

/// One capacity type's pods, as the policy and the fleet meter need them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolObservation {
    /// The policy's view.
    pub capacity: CapacityObserved,
    /// Pods bound to a node (starting, ready, interrupted or draining): what costs money.
    pub scheduled: u32,
    /// The slowest [`cold_start`] among the ready pods.
    pub slowest_cold_start: Option<Duration>,
    /// A worker's refusal to start because its model does not fit its device
    /// ([`memory_refusal`]), if one of the pods shows one.
    pub memory_refusal: Option<String>,
}

/// How long a Ready pod took from creation to Ready; `None` for a pod that is not Ready, or
/// whose containers restarted (its `Ready` time is that of the restart, not of its start).
pub fn cold_start(pod: &Pod) -> Option<Duration> {
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    let restarted = status
        .container_statuses
        .iter()
        .flatten()
        .any(|c| c.restart_count > 0);
    if restarted {
        return None;
    }
    let created = SystemTime::from(pod.metadata.creation_timestamp.as_ref()?.0);
    let ready_at = SystemTime::from(ready.last_transition_time.as_ref()?.0);
    ready_at.duration_since(created).ok()
}

/// The verdict of the memory plan a worker refused to start with: the last line of its
/// container's termination message (the runtime writes the plan there, ending with "the model
/// does not fit ...: it needs X more; ..."), from the running or the last terminated state.
pub fn memory_refusal(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find_map(|c| {
        let states = [c.state.as_ref(), c.last_state.as_ref()];
        states.into_iter().flatten().find_map(|state| {
            let message = state.terminated.as_ref()?.message.as_deref()?;
            message
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| l.starts_with("the model does not fit"))
                .map(str::to_string)
        })
    })
}

/// Whether `node` shows a spot interruption signal.
pub fn node_interrupted(node: &Node) -> bool {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().any(|t| taint_signal(&t.key).is_some()))
        .unwrap_or(false);
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| {
            c.iter()
                .any(|c| condition_signal(&c.type_, &c.status).is_some())
        })
        .unwrap_or(false);
    taints || conditions
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        .unwrap_or(false)
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Time since the UNIX epoch: the clock the controller runs the policy on.
pub fn epoch(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

/// Summarises `pods` (one capacity type of one Model); `node` looks a node up by name.
pub fn observe_pool<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    node: impl Fn(&str) -> Option<std::sync::Arc<Node>>,
) -> PoolObservation {
    let mut out = PoolObservation::default();
    for pod in pods {
        if finished(pod) {
            continue;
        }
        let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let deleting = pod.metadata.deletion_timestamp.is_some();
        if !deleting && out.memory_refusal.is_none() {
            out.memory_refusal = memory_refusal(pod);
        }
        let Some(node_name) = bound else {
            if !deleting {
                let created = pod
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| epoch(SystemTime::from(t.0)))
                    .unwrap_or_default();
                out.capacity.pending_since.push(created);
            }
            continue;
        };
        out.scheduled += 1;
        if deleting {
            continue;
        }
        if node(node_name).is_some_and(|n| node_interrupted(&n)) {
            out.capacity.interrupted += 1;
        } else if is_ready(pod) {
            out.capacity.ready += 1;
            out.slowest_cold_start = out.slowest_cold_start.max(cold_start(pod));
        } else {
            out.capacity.starting += 1;
        }
    }
    out.capacity.pending_since.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerStatus, NodeCondition, NodeSpec, NodeStatus, PodCondition, PodSpec, PodStatus,
        Taint,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn pod(node: Option<&str>, ready: bool, created_s: i64) -> Pod {
        Pod {
            metadata: ObjectMeta {
                creation_timestamp: Some(Time(Timestamp::from_second(created_s).unwrap())),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(String::from),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(if node.is_some() { "Running" } else { "Pending" }.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    fn node(taint: Option<&str>, condition: Option<(&str, &str)>) -> Arc<Node> {
        Arc::new(Node {
            spec: Some(NodeSpec {
                taints: taint.map(|k| {
                    vec![Taint {
                        key: k.into(),
                        effect: "NoSchedule".into(),
                        ..Taint::default()
                    }]
                }),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: condition.map(|(t, s)| {
                    vec![NodeCondition {
                        type_: t.into(),
                        status: s.into(),
                        ..NodeCondition::default()
                    }]
                }),
                ..NodeStatus::default()
            }),
            ..Node::default()
        })
    }

    #[test]
    fn classifies_pending_starting_ready_and_interrupted() {
        let nodes: HashMap<&str, Arc<Node>> = HashMap::from([
            ("ok", node(None, None)),
            ("karpenter", node(Some("karpenter.sh/disrupted"), None)),
            (
                "gke",
                node(Some("cloud.google.com/impending-node-termination"), None),
            ),
            ("cond", node(None, Some(("SpotInterruption", "True")))),
            (
                "cond-false",
                node(None, Some(("SpotInterruption", "False"))),
            ),
        ]);
        let pods = [
            pod(None, false, 200),
            pod(None, false, 100),
            pod(Some("ok"), false, 50),
            pod(Some("ok"), true, 50),
            pod(Some("cond-false"), true, 50),
            pod(Some("karpenter"), true, 50),
            pod(Some("gke"), false, 50),
            pod(Some("cond"), true, 50),
            pod(Some("unknown-node"), true, 50),
        ];
        let got = observe_pool(&pods, |n| nodes.get(n).cloned());
        assert_eq!(
            got.capacity,
            CapacityObserved {
                ready: 3,
                starting: 1,
                pending_since: vec![Duration::from_secs(100), Duration::from_secs(200)],
                interrupted: 3,
            }
        );
        assert_eq!(got.scheduled, 7);
    }

    #[test]
    fn deleting_pods_cost_but_do_not_serve_and_finished_pods_are_ignored() {
        let mut deleting = pod(Some("ok"), true, 10);
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(20).unwrap()));
        let mut deleting_pending = pod(None, false, 10);
        deleting_pending.metadata.deletion_timestamp =
            Some(Time(Timestamp::from_second(20).unwrap()));
        let mut failed = pod(Some("ok"), false, 10);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let nodes = HashMap::from([("ok", node(None, None))]);
        let got = observe_pool(&[deleting, deleting_pending, failed], |n| {
            nodes.get(n).cloned()
        });
        assert_eq!(got.capacity, CapacityObserved::default());
        assert_eq!(got.scheduled, 1);
    }

    fn started(created_s: i64, ready_s: i64, restarts: i32) -> Pod {
        let mut p = pod(Some("ok"), true, created_s);
        let status = p.status.as_mut().unwrap();
        status.conditions.as_mut().unwrap()[0].last_transition_time =
            Some(Time(Timestamp::from_second(ready_s).unwrap()));
        status.container_statuses = Some(vec![ContainerStatus {
            restart_count: restarts,
            ..ContainerStatus::default()
        }]);
        p
    }

    #[test]
    fn cold_start_is_creation_to_ready_of_pods_that_never_restarted() {
        assert_eq!(
            cold_start(&started(100, 175, 0)),
            Some(Duration::from_secs(75))
        );
        assert_eq!(cold_start(&started(100, 175, 1)), None, "restarted");
        let mut unready = started(100, 175, 0);
        unready
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "False".into();
        assert_eq!(cold_start(&unready), None);
        assert_eq!(cold_start(&pod(Some("ok"), true, 100)), None, "no time");
        // the pool keeps the slowest of its ready pods; an interrupted one does not count
        let nodes = HashMap::from([
            ("ok", node(None, None)),
            ("karpenter", node(Some("karpenter.sh/disrupted"), None)),
        ]);
        let mut doomed = started(0, 500, 0);
        doomed.spec.as_mut().unwrap().node_name = Some("karpenter".into());
        let pods = [
            started(100, 130, 0),
            started(200, 290, 0),
            started(0, 400, 2),
            doomed,
        ];
        let got = observe_pool(&pods, |n| nodes.get(n).cloned());
        assert_eq!(got.capacity.ready, 3);
        assert_eq!(got.slowest_cold_start, Some(Duration::from_secs(90)));
        assert_eq!(observe_pool(&[], |_| None).slowest_cold_start, None);
    }

    #[test]
    fn aws_nth_taint_interrupts() {
        assert!(node_interrupted(&node(
            Some("aws-node-termination-handler/spot-itn"),
            None
        )));
        assert!(!node_interrupted(&node(Some("nvidia.com/gpu"), None)));
        assert!(!node_interrupted(&Node::default()));
    }

    /// A pod whose container last ended with `message` (restarting, as in CrashLoopBackOff).
    fn crashed_with(message: &str) -> Pod {
        use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};
        let mut p = pod(Some("ok"), false, 100);
        p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: "runtime".into(),
            restart_count: 3,
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    message: Some(message.into()),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]);
        p
    }

    #[test]
    fn a_worker_that_does_not_fit_its_device_is_reported_with_its_verdict() {
        let plan = "memory plan: Meta-Llama-3-8B-Instruct (llama, 32 layers) on cuda:0\n  \
                    total          22.47 GiB\n  available      22.00 GiB  (NVIDIA L4: free of 22.49 GiB)\n\
                    the model does not fit cuda:0: it needs 482.0 MiB more; lower --kv-cache-memory to at most 7.53 GiB (61672 tokens), or choose a smaller quantisation or device";
        let refused = crashed_with(plan);
        assert_eq!(
            memory_refusal(&refused).as_deref(),
            Some(
                "the model does not fit cuda:0: it needs 482.0 MiB more; lower --kv-cache-memory to at most 7.53 GiB (61672 tokens), or choose a smaller quantisation or device"
            )
        );
        // Other crashes are not a memory plan's verdict.
        assert_eq!(memory_refusal(&crashed_with("sha256 mismatch")), None);
        assert_eq!(memory_refusal(&pod(Some("ok"), true, 1)), None);
        let nodes = HashMap::from([("ok", node(None, None))]);
        let pool = observe_pool(&[pod(Some("ok"), true, 1), refused], |n| {
            nodes.get(n).cloned()
        });
        assert!(pool.memory_refusal.unwrap().contains("does not fit cuda:0"));
        assert_eq!(pool.capacity.ready, 1);
    }
}
