//! Whether a pod fits a node (pure): the default scheduler's filters that worker pods meet —
//! node selector, required node affinity, taints against tolerations, cordoned nodes, and
//! resource requests against what the node's pods already request.

use std::collections::BTreeMap;

use tidal_controller::k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};
use tidal_controller::k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Amounts per resource name, in thousandths of the unit (`cpu: 1` is 1000, `memory: 1Ki`
/// is 1 024 000), so that millicores add up exactly.
pub type Amounts = BTreeMap<String, i128>;

/// Parses a Kubernetes quantity (`500m`, `2`, `16Gi`, `1.5G`, `1e3`) into thousandths,
/// rounded up as the API server rounds requests; `None` when it is not one.
pub fn milli(q: &str) -> Option<i128> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale: f64 = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    Some((value * scale * 1000.0).ceil() as i128)
}

fn add(into: &mut Amounts, from: &BTreeMap<String, Quantity>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += milli(&v.0).unwrap_or(0);
    }
}

/// What a pod requests, as the scheduler counts it: per resource, the larger of its
/// containers' sum and its largest init container (a request left out defaults to the limit,
/// as the API server defaults it), plus the pod overhead and one `pods` slot.
pub fn requests(spec: &PodSpec) -> Amounts {
    fn container(c: &tidal_controller::k8s_openapi::api::core::v1::Container) -> Amounts {
        let mut out = Amounts::new();
        let r = c.resources.as_ref();
        let requests = r.and_then(|r| r.requests.clone()).unwrap_or_default();
        let mut effective = r.and_then(|r| r.limits.clone()).unwrap_or_default();
        effective.extend(requests);
        add(&mut out, &effective);
        out
    }
    let mut total = Amounts::new();
    for c in &spec.containers {
        for (k, v) in container(c) {
            *total.entry(k).or_default() += v;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in container(c) {
            let t = total.entry(k).or_default();
            *t = (*t).max(v);
        }
    }
    if let Some(overhead) = &spec.overhead {
        add(&mut total, overhead);
    }
    *total.entry("pods".into()).or_default() += 1000;
    total
}

/// A node's allocatable amounts.
pub fn allocatable(node: &Node) -> Amounts {
    let mut out = Amounts::new();
    if let Some(a) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
        add(&mut out, a);
    }
    out
}

/// Why a pod does not fit a node, worded as the scheduler's `FailedScheduling` reasons.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Misfit {
    /// The node is not Ready, or is going away.
    NotReady,
    /// The node is cordoned (`spec.unschedulable`).
    Unschedulable,
    /// `nodeSelector` or required node affinity does not match.
    Selector,
    /// A `NoSchedule`/`NoExecute` taint the pod does not tolerate.
    Taint(String),
    /// Not enough of a resource left.
    Insufficient(String),
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misfit::NotReady => write!(f, "node(s) were not ready"),
            Misfit::Unschedulable => write!(f, "node(s) were unschedulable"),
            Misfit::Selector => write!(f, "node(s) didn't match Pod's node affinity/selector"),
            Misfit::Taint(t) => write!(f, "node(s) had untolerated taint {{{t}}}"),
            Misfit::Insufficient(r) => write!(f, "Insufficient {r}"),
        }
    }
}

/// Whether `toleration` tolerates `taint` (the API's matching rules).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = toleration.key.as_deref().unwrap_or("");
    let op = toleration.operator.as_deref().unwrap_or("Equal");
    let key_ok = match (key, op) {
        ("", "Exists") => true,
        (k, "Exists") => k == taint.key,
        (k, _) => {
            k == taint.key
                && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    };
    effect_ok && key_ok
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn requirement(value: Option<&str>, r: &NodeSelectorRequirement) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x)
        }
        _ => false,
    }
}

fn term_matches(node: &Node, term: &NodeSelectorTerm) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    // An empty term matches no node.
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs.iter().all(|r| requirement(label(node, &r.key), r))
        && fields.iter().all(|r| {
            let name = node.metadata.name.as_deref();
            r.key == "metadata.name" && requirement(name, r)
        })
}

/// Whether `node` matches the pod's `nodeSelector` and required node affinity.
pub fn selects(spec: &PodSpec, node: &Node) -> bool {
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| label(node, k) == Some(v.as_str()));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity_ok = required.is_none_or(|r| {
        r.node_selector_terms
            .iter()
            .any(|term| term_matches(node, term))
    });
    selector_ok && affinity_ok
}

/// Whether `node` is Ready (its `Ready` condition is `True`) and not being deleted.
pub fn node_ready(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether a pod with `spec` and `requests` fits `node`, whose pods already request `used`.
pub fn fits(spec: &PodSpec, requests: &Amounts, node: &Node, used: &Amounts) -> Result<(), Misfit> {
    if !node_ready(node) {
        return Err(Misfit::NotReady);
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let node_spec = node.spec.as_ref();
    if node_spec.and_then(|s| s.unschedulable) == Some(true) {
        let cordon = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        if !tolerations.iter().any(|t| tolerates(t, &cordon)) {
            return Err(Misfit::Unschedulable);
        }
    }
    if !selects(spec, node) {
        return Err(Misfit::Selector);
    }
    for taint in node_spec
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
    {
        let blocking = taint.effect == "NoSchedule" || taint.effect == "NoExecute";
        if blocking && !tolerations.iter().any(|t| tolerates(t, taint)) {
            let value = taint.value.as_deref().unwrap_or("");
            return Err(Misfit::Taint(format!("{}: {value}", taint.key)));
        }
    }
    let have = allocatable(node);
    for (resource, want) in requests {
        if *want == 0 {
            continue;
        }
        let free =
            have.get(resource).copied().unwrap_or(0) - used.get(resource).copied().unwrap_or(0);
        if *want > free {
            return Err(Misfit::Insufficient(resource.clone()));
        }
    }
    Ok(())
}

/// The scheduler's message for a pod that fits none of `total` nodes: `0/3 nodes are
/// available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node
/// affinity/selector.`
pub fn unschedulable_message(total: usize, misfits: &[Misfit]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for m in misfits {
        *counts.entry(m.to_string()).or_default() += 1;
    }
    let reasons: Vec<String> = counts.iter().map(|(m, n)| format!("{n} {m}")).collect();
    if reasons.is_empty() {
        format!("0/{total} nodes are available.")
    } else {
        format!("0/{total} nodes are available: {}.", reasons.join(", "))
    }
}
