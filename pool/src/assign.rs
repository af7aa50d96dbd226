//! From the plan's actions to each worker's assignment, the list of models it should hold
//! (pure).
//!
//! A worker's assignment starts from what was last written for it (or, when nothing was,
//! from what its heartbeat holds, so that taking over a pool unloads nothing), then the
//! plan's unloads leave it and its loads join it. A model the worker failed to load stays
//! in its assignment while the model has work, so the worker does not retry it in a loop
//! (the placement puts it elsewhere); once the model is idle it leaves, and a later burst
//! may try that worker again (a fixed file, more memory after other unloads).

use std::collections::{BTreeMap, BTreeSet};

use tidal_autoscaler::pool::Action;
use tidal_queue::PoolHeartbeat;

/// The assignments that change, worker → models in id order. `busy` tells whether a model
/// has work (queued or running) now.
pub fn next_assignments(
    beats: &[PoolHeartbeat],
    written: &BTreeMap<String, Vec<String>>,
    actions: &[Action],
    busy: impl Fn(&str) -> bool,
) -> BTreeMap<String, Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for b in beats {
        let mut models: BTreeSet<String> = match written.get(&b.worker) {
            Some(w) => w.iter().cloned().collect(),
            None => b
                .loaded
                .iter()
                .map(|l| l.model.clone())
                .chain(b.loading.iter().cloned())
                .collect(),
        };
        for f in &b.failed {
            if !busy(&f.model) {
                models.remove(&f.model);
            }
        }
        next.insert(&b.worker, models);
    }
    for a in actions {
        match a {
            Action::Unload { model, worker, .. } => {
                if let Some(set) = next.get_mut(worker.as_str()) {
                    set.remove(model);
                }
            }
            Action::Load { model, worker } => {
                if let Some(set) = next.get_mut(worker.as_str()) {
                    set.insert(model.clone());
                }
            }
        }
    }
    next.into_iter()
        .filter_map(|(worker, set)| {
            let models: Vec<String> = set.into_iter().collect();
            let before = written.get(worker).map(|w| {
                let mut w = w.clone();
                w.sort();
                w
            });
            (before.as_ref() != Some(&models)).then(|| (worker.to_string(), models))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::tests::beat;
    use tidal_autoscaler::pool::Unload;
    use tidal_queue::FailedLoad;

    fn load(m: &str, w: &str) -> Action {
        Action::Load {
            model: m.into(),
            worker: w.into(),
        }
    }

    fn unload(m: &str, w: &str) -> Action {
        Action::Unload {
            model: m.into(),
            worker: w.into(),
            why: Unload::Idle,
        }
    }

    fn list(models: &[&str]) -> Vec<String> {
        models.iter().map(|m| m.to_string()).collect()
    }

    #[test]
    fn without_a_written_assignment_a_worker_starts_from_what_it_holds() {
        let beats = [beat("a", &["x", "y"], &[])];
        // nothing changes: still written, so that the worker follows the controller from now
        let out = next_assignments(&beats, &BTreeMap::new(), &[], |_| false);
        assert_eq!(out, BTreeMap::from([("a".into(), list(&["x", "y"]))]));
        let out = next_assignments(&beats, &BTreeMap::new(), &[unload("y", "a")], |_| false);
        assert_eq!(out, BTreeMap::from([("a".into(), list(&["x"]))]));
    }

    #[test]
    fn only_changed_assignments_are_returned_and_loads_follow_unloads() {
        let beats = [beat("a", &["x"], &[]), beat("b", &["z"], &[])];
        let written = BTreeMap::from([("a".into(), list(&["x"])), ("b".into(), list(&["z"]))]);
        let actions = [unload("x", "a"), load("m", "a")];
        let out = next_assignments(&beats, &written, &actions, |_| true);
        assert_eq!(out, BTreeMap::from([("a".into(), list(&["m"]))]));
        assert!(next_assignments(&beats, &written, &[], |_| true).is_empty());
    }

    #[test]
    fn an_assigned_model_still_loading_stays_assigned() {
        let beats = [beat("a", &[], &[])];
        let written = BTreeMap::from([("a".into(), list(&["x"]))]);
        assert!(next_assignments(&beats, &written, &[], |_| true).is_empty());
    }

    #[test]
    fn a_failed_model_stays_while_busy_and_leaves_once_idle() {
        let mut b = beat("a", &[], &[]);
        b.failed = vec![FailedLoad {
            model: "x".into(),
            error: "checksum".into(),
        }];
        let written = BTreeMap::from([("a".into(), list(&["x"]))]);
        let beats = [b];
        assert!(next_assignments(&beats, &written, &[], |_| true).is_empty());
        let out = next_assignments(&beats, &written, &[], |_| false);
        assert_eq!(out, BTreeMap::from([("a".into(), Vec::new())]));
    }

    #[test]
    fn actions_for_workers_without_a_heartbeat_are_ignored() {
        let out = next_assignments(&[], &BTreeMap::new(), &[load("x", "gone")], |_| true);
        assert!(out.is_empty());
    }
}
