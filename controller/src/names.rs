//! Names and labels the controller gives the objects it owns, in one place so the builder,
//! the observer and the tests agree.

use std::collections::BTreeMap;

use tidal_queue::CapacityType;

/// Field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "tidal-controller";
/// Pod label: the Model's name.
pub const MODEL_LABEL: &str = "tidal.dev/model";
/// Pod label of a `ModelPool`'s workers: the pool's name.
pub const POOL_LABEL: &str = "tidal.dev/pool";
/// Pod label: `spot` or `on-demand`.
pub const CAPACITY_LABEL: &str = "tidal.dev/capacity";
/// Label on every object the controller creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "tidal-controller";
/// Longest Model name: `{name}-ondemand` and the pod label must stay within 63 characters.
pub const MAX_NAME_LEN: usize = 54;

/// The two capacity types, in the order the controller handles them.
pub const CAPACITIES: [CapacityType; 2] = [CapacityType::Spot, CapacityType::OnDemand];

/// The model id the queue, the gateway and billing use: `namespace/name`.
pub fn model_id(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Name of a Model's Deployment for one capacity type.
pub fn deployment_name(model: &str, capacity: CapacityType) -> String {
    format!("{model}-{}", capacity_suffix(capacity))
}

/// `spot` / `ondemand`, the Deployment name suffix.
pub fn capacity_suffix(capacity: CapacityType) -> &'static str {
    match capacity {
        CapacityType::Spot => "spot",
        CapacityType::OnDemand => "ondemand",
    }
}

/// `spot` / `on-demand`: the pod label value and the worker's `--capacity-type`.
pub fn capacity_value(capacity: CapacityType) -> &'static str {
    match capacity {
        CapacityType::Spot => "spot",
        CapacityType::OnDemand => "on-demand",
    }
}

/// Labels that select one capacity type's pods of a Model (the Deployment's selector).
pub fn selector_labels(model: &str, capacity: CapacityType) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MODEL_LABEL.to_string(), model.to_string()),
        (
            CAPACITY_LABEL.to_string(),
            capacity_value(capacity).to_string(),
        ),
    ])
}

/// Labels of the Deployments and their pods.
pub fn labels(model: &str, capacity: CapacityType) -> BTreeMap<String, String> {
    let mut l = selector_labels(model, capacity);
    l.insert("app.kubernetes.io/name".into(), "tidal-runtime".into());
    l.insert("app.kubernetes.io/instance".into(), model.to_string());
    l.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    l
}

/// Labels that select one capacity type's pods of a `ModelPool`.
pub fn pool_selector_labels(pool: &str, capacity: CapacityType) -> BTreeMap<String, String> {
    BTreeMap::from([
        (POOL_LABEL.to_string(), pool.to_string()),
        (
            CAPACITY_LABEL.to_string(),
            capacity_value(capacity).to_string(),
        ),
    ])
}

/// Labels of a `ModelPool`'s Deployments and their pods.
pub fn pool_labels(pool: &str, capacity: CapacityType) -> BTreeMap<String, String> {
    let mut l = pool_selector_labels(pool, capacity);
    l.insert("app.kubernetes.io/name".into(), "tidal-runtime".into());
    l.insert("app.kubernetes.io/instance".into(), pool.to_string());
    l.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_design() {
        assert_eq!(model_id("ns", "llama"), "ns/llama");
        assert_eq!(deployment_name("llama", CapacityType::Spot), "llama-spot");
        assert_eq!(
            deployment_name("llama", CapacityType::OnDemand),
            "llama-ondemand"
        );
        let l = labels("llama", CapacityType::OnDemand);
        assert_eq!(l[CAPACITY_LABEL], "on-demand");
        assert_eq!(l[MODEL_LABEL], "llama");
        assert_eq!(l[MANAGED_BY_LABEL], "tidal-controller");
        assert_eq!(
            deployment_name(&"x".repeat(MAX_NAME_LEN), CapacityType::OnDemand).len(),
            63
        );
    }
}
