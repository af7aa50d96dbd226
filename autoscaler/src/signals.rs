//! Recognising spot interruption signals on nodes.
//!
//! The controller reads node taints and conditions and asks this module whether a node is
//! about to go away. Known signals: Karpenter's disruption taint (`karpenter.sh/disrupted`,
//! `karpenter.sh/disruption` on older versions), GKE's impending-termination taint
//! (`cloud.google.com/impending-node-termination`), the AWS node-termination-handler taints
//! (`aws-node-termination-handler/*`), and node conditions set by node-problem-detector style
//! handlers (e.g. `SpotInterruption`, `TerminationNotice`) when their status is `True`.

/// Where an interruption signal came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptionSource {
    /// Karpenter is disrupting the node (consolidation, expiry, spot interruption).
    Karpenter,
    /// GKE announced the node's termination (spot/preemptible).
    Gke,
    /// AWS node-termination-handler received a spot ITN, rebalance or scheduled event.
    AwsNodeTerminationHandler,
    /// A node condition reports an imminent termination.
    NodeCondition,
}

/// Classifies a node taint key.
pub fn taint_signal(key: &str) -> Option<InterruptionSource> {
    match key {
        "karpenter.sh/disrupted" | "karpenter.sh/disruption" => Some(InterruptionSource::Karpenter),
        "cloud.google.com/impending-node-termination" => Some(InterruptionSource::Gke),
        k if k.starts_with("aws-node-termination-handler/") => {
            Some(InterruptionSource::AwsNodeTerminationHandler)
        }
        _ => None,
    }
}

/// Node condition types that announce an imminent termination when their status is `True`.
pub const TERMINATION_CONDITIONS: &[&str] = &[
    "SpotInterruption",
    "TerminationNotice",
    "PreemptionNotice",
    "ImpendingTermination",
];

/// Classifies a node condition (`type`, `status`).
pub fn condition_signal(kind: &str, status: &str) -> Option<InterruptionSource> {
    (status == "True" && TERMINATION_CONDITIONS.contains(&kind))
        .then_some(InterruptionSource::NodeCondition)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_taints_are_signals() {
        assert_eq!(
            taint_signal("karpenter.sh/disrupted"),
            Some(InterruptionSource::Karpenter)
        );
        assert_eq!(
            taint_signal("karpenter.sh/disruption"),
            Some(InterruptionSource::Karpenter)
        );
        assert_eq!(
            taint_signal("cloud.google.com/impending-node-termination"),
            Some(InterruptionSource::Gke)
        );
        assert_eq!(
            taint_signal("aws-node-termination-handler/spot-itn"),
            Some(InterruptionSource::AwsNodeTerminationHandler)
        );
        assert_eq!(
            taint_signal("aws-node-termination-handler/rebalance-recommendation"),
            Some(InterruptionSource::AwsNodeTerminationHandler)
        );
    }

    #[test]
    fn ordinary_taints_are_not() {
        for key in [
            "node.kubernetes.io/unschedulable",
            "karpenter.sh/unregistered",
            "nvidia.com/gpu",
            "cloud.google.com/gke-spot",
            "",
        ] {
            assert_eq!(taint_signal(key), None, "{key}");
        }
    }

    #[test]
    fn conditions_count_only_when_true() {
        assert_eq!(
            condition_signal("SpotInterruption", "True"),
            Some(InterruptionSource::NodeCondition)
        );
        assert_eq!(condition_signal("SpotInterruption", "False"), None);
        assert_eq!(condition_signal("SpotInterruption", "Unknown"), None);
        assert_eq!(condition_signal("Ready", "True"), None);
    }
}
