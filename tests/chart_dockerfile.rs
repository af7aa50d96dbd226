//! The Dockerfile against the chart and the controller, without building it: the image's
//! binary, entry point, user and ports are the ones the chart's pods and the controller's
//! worker pods expect. (Building needs the base images from Docker Hub and gcr.io.)

mod chart_common;
mod skip;

use chart_common::*;

/// The Dockerfile's instructions: continuation lines joined, comments and blank lines dropped,
/// as (keyword in upper case, arguments).
fn instructions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile");
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (kw, args) = current.split_once(' ').unwrap_or((&current, ""));
                out.push((kw.to_uppercase(), args.trim().to_string()));
                current.clear();
            }
        }
    }
    out
}

/// The instructions of the last stage (what the image is).
fn final_stage() -> Vec<(String, String)> {
    let all = instructions();
    let start = all
        .iter()
        .rposition(|(k, _)| k == "FROM")
        .expect("a FROM line");
    all[start..].to_vec()
}

fn one(stage: &[(String, String)], kw: &str) -> String {
    let found: Vec<_> = stage.iter().filter(|(k, _)| k == kw).collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {kw} in the final stage: {found:?}"
    );
    found[0].1.clone()
}

#[test]
fn the_image_runs_the_tidal_binary_as_the_charts_user() {
    let stage = final_stage();
    let from = one(&stage, "FROM");
    assert!(
        from.ends_with(":nonroot"),
        "the runtime base is a nonroot image: {from}"
    );
    // Built and copied under the name the chart and the controller run.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_tidal"))
        .file_name()
        .expect("binary name")
        .to_string_lossy()
        .into_owned();
    assert_eq!(bin, "tidal");
    let all = instructions();
    assert!(
        all.iter().any(|(k, a)| k == "RUN"
            && a.contains(&format!("cargo build --release --locked --bin {bin} "))),
        "the build stage builds --bin {bin}"
    );
    assert_eq!(
        one(&stage, "COPY"),
        format!("--from=build /usr/local/bin/{bin} /usr/local/bin/{bin}")
    );
    assert_eq!(one(&stage, "ENTRYPOINT"), format!("[\"{bin}\"]"));
    // The worker pods the controller creates run the same binary as the same user.
    let model = example_model();
    let d = tidal_controller::deployment::build(
        &model,
        &model.spec.source().expect("source"),
        tidal_queue::CapacityType::OnDemand,
        1,
        &tidal_controller::deployment::WorkerConfig {
            queue_url: "redis://redis:6379".into(),
            key_prefix: None,
        },
    );
    let pod = d.spec.and_then(|s| s.template.spec).expect("pod spec");
    assert_eq!(
        pod.containers[0].command.as_deref(),
        Some(&[bin.clone()][..])
    );
    let worker_sc = pod.security_context.expect("worker pod security context");

    // USER uid:gid is the chart's podSecurityContext and the worker pods' user.
    let user = one(&stage, "USER");
    let (uid, gid) = user.split_once(':').expect("USER uid:gid");
    let (uid, gid): (i64, i64) = (uid.parse().expect("numeric uid"), gid.parse().expect("gid"));
    let values = chart_yaml("values.yaml");
    let pod = &values["podSecurityContext"];
    assert_eq!(pod["runAsUser"], uid);
    assert_eq!(pod["runAsGroup"], gid);
    assert_eq!(pod["fsGroup"], gid);
    assert_eq!(pod["runAsNonRoot"], true);
    assert_ne!(uid, 0);
    assert_eq!(
        (
            worker_sc.run_as_user,
            worker_sc.run_as_group,
            worker_sc.fs_group
        ),
        (Some(uid), Some(gid), Some(gid))
    );
}

fn example_model() -> tidal_crds::Model {
    serde_yaml::from_str(include_str!("../crds/examples/small-cpu-ondemand.yaml"))
        .expect("example Model")
}

#[test]
fn the_image_exposes_the_ports_the_chart_and_the_workers_use() {
    let exposed: Vec<u64> = final_stage()
        .iter()
        .filter(|(k, _)| k == "EXPOSE")
        .flat_map(|(_, a)| {
            a.split_whitespace()
                .map(|p| p.parse::<u64>().expect("port"))
        })
        .collect();
    let values = chart_yaml("values.yaml");
    let wanted = [
        ("gateway.port", &values["gateway"]["port"]),
        ("billing.port", &values["billing"]["port"]),
        (
            "controller.metricsPort",
            &values["controller"]["metricsPort"],
        ),
    ];
    for (what, port) in wanted {
        let port = port
            .as_u64()
            .unwrap_or_else(|| panic!("{what} is a number"));
        assert!(
            exposed.contains(&port),
            "{what} {port} not in EXPOSE {exposed:?}"
        );
    }
    // A Model's default runtime port (the worker's --listen).
    assert!(exposed.contains(&u64::from(example_model().spec.runtime.port)));
}
