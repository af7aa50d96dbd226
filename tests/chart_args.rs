//! The chart's command lines against the binary, without Helm: every role and flag the
//! templates pass to the image is a subcommand and option of `tidal` (`tidal <role> --help`),
//! every `TIDAL_*` environment variable they set is one an option reads, and the worker
//! command lines the controller writes into the workers' Deployments are `tidal runtime`'s.
//!
//! Templates are Go templates, not YAML, so the command lines are read by a convention the
//! templates follow and state in their header comment:
//!
//! ```yaml
//!           command: ["tidal"]
//!           args:
//!             - gateway                       # the role, a bare word
//!             - "--listen=0.0.0.0:{{ ... }}"  # one double-quoted "--flag=value" per flag
//!             {{- if ... }}                   # template lines may sit between items
//!             - "--namespace={{ ... }}"
//!             {{- end }}
//!           env:                              # first line indented like `args:` ends it
//! ```
//!
//! Any other item under such an `args:` fails the test, so the convention cannot drift
//! silently. (`extraArgs` from values are appended by a `toYaml` line and are the
//! operator's.)

mod chart_common;
mod skip;

use chart_common::*;
use tidal_queue::CapacityType;

/// One `tidal` container of a template.
#[derive(Debug)]
struct Invocation {
    file: String,
    role: String,
    flags: Vec<String>,
    env: Vec<String>,
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_template_line(line: &str) -> bool {
    line.trim_start().starts_with("{{")
}

/// `"--flag=value"` or `"--flag"` → `--flag`.
fn quoted_flag(item: &str) -> Option<String> {
    let inner = item.strip_prefix('"')?.strip_suffix('"')?;
    let flag = inner.split('=').next()?;
    let name = flag.strip_prefix("--")?;
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    ok.then(|| flag.to_string())
}

/// The `tidal` containers of one template file, by the convention above.
fn invocations(file: &str, text: &str) -> Vec<Invocation> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != r#"command: ["tidal"]"# {
            i += 1;
            continue;
        }
        let args_at = (i + 1..lines.len())
            .find(|&j| !is_template_line(lines[j]))
            .unwrap_or_else(|| panic!("{file}:{}: `command` without `args`", i + 1));
        assert_eq!(
            lines[args_at].trim(),
            "args:",
            "{file}:{}: `args:` must follow `command: [\"tidal\"]`",
            args_at + 1
        );
        let base = indent(lines[args_at]);
        let mut items = Vec::new();
        let mut j = args_at + 1;
        while j < lines.len() {
            let line = lines[j];
            if line.trim().is_empty() || is_template_line(line) {
                j += 1;
                continue;
            }
            if indent(line) <= base {
                break;
            }
            let item = line
                .trim()
                .strip_prefix("- ")
                .unwrap_or_else(|| panic!("{file}:{}: not a list item: {line}", j + 1));
            items.push((j + 1, item.to_string()));
            j += 1;
        }
        let (first_line, role) = items
            .first()
            .cloned()
            .unwrap_or_else(|| panic!("{file}:{}: empty args", args_at + 1));
        assert!(
            !role.is_empty() && role.chars().all(|c| c.is_ascii_lowercase()),
            "{file}:{first_line}: the first argument must be the role, got {role}"
        );
        let flags = items[1..]
            .iter()
            .map(|(n, item)| {
                quoted_flag(item).unwrap_or_else(|| {
                    panic!("{file}:{n}: argument {item} is not a double-quoted \"--flag=value\"")
                })
            })
            .collect();
        // Environment variables of the same container: `- name: X` items after `args`
        // (a template holds one tidal container).
        let env = lines[j..]
            .iter()
            .filter_map(|l| l.trim().strip_prefix("- name: "))
            .map(|n| n.trim().to_string())
            .filter(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            .collect();
        out.push(Invocation {
            file: file.to_string(),
            role,
            flags,
            env,
        });
        i = j;
    }
    out
}

fn all_invocations() -> Vec<Invocation> {
    let mut out = Vec::new();
    let dir = chart_dir().join("templates");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("templates/")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    for name in names {
        let text = chart_file(&format!("templates/{name}"));
        out.extend(invocations(&name, &text));
    }
    out
}

/// The environment variables every role gets from `tidal.connectionEnv` in _helpers.tpl.
fn helper_env() -> Vec<String> {
    let text = chart_file("templates/_helpers.tpl");
    let start = text
        .find(r#"define "tidal.connectionEnv""#)
        .expect("tidal.connectionEnv in _helpers.tpl");
    let block = &text[start..];
    let block = &block[..block.find("{{- end }}").expect("end of the define")];
    block
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- name: "))
        .map(|n| n.trim().to_string())
        .collect()
}

#[test]
fn the_chart_runs_the_three_roles() {
    let mut roles: Vec<String> = all_invocations().into_iter().map(|i| i.role).collect();
    roles.sort();
    assert_eq!(roles, ["billing", "controller", "gateway"]);
}

#[test]
fn every_flag_the_templates_pass_is_an_option_of_its_role() {
    let invocations = all_invocations();
    assert!(!invocations.is_empty());
    for inv in &invocations {
        let help_text = help(&inv.role);
        assert!(!inv.flags.is_empty(), "{}: no flags read", inv.file);
        for flag in &inv.flags {
            assert!(
                has_flag(&help_text, flag),
                "{}: `tidal {}` has no option {flag}:\n{help_text}",
                inv.file,
                inv.role
            );
        }
    }
}

#[test]
fn every_environment_variable_the_templates_set_is_read_by_an_option() {
    let shared = helper_env();
    assert_eq!(shared, ["TIDAL_DATABASE_URL", "TIDAL_REDIS_URL"]);
    for inv in all_invocations() {
        let help_text = help(&inv.role);
        for name in shared.iter().chain(&inv.env) {
            // POD_NAME is read by the controller's code, not by an option.
            if name == "POD_NAME" {
                assert_eq!(inv.role, "controller");
                let run = std::fs::read_to_string(root().join("controller/src/run.rs"))
                    .expect("controller/src/run.rs");
                assert!(
                    run.contains("\"POD_NAME\""),
                    "the controller reads POD_NAME"
                );
                continue;
            }
            assert!(
                has_env(&help_text, name),
                "{}: `tidal {}` reads no environment variable {name}",
                inv.file,
                inv.role
            );
        }
    }
}

#[test]
fn the_extractor_follows_the_convention() {
    let text = r#"
      containers:
        - name: x
          command: ["tidal"]
          args:
            - gateway
            - "--listen=0.0.0.0:{{ .Values.port }}"
            {{- if .Values.x }}
            - "--key-prefix={{ .Values.keyPrefix }}"
            {{- end }}
            {{- with .Values.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          env:
            - name: TIDAL_REDIS_URL
"#;
    let inv = invocations("t.yaml", text);
    assert_eq!(inv.len(), 1);
    assert_eq!(inv[0].role, "gateway");
    assert_eq!(inv[0].flags, ["--listen", "--key-prefix"]);
    assert_eq!(inv[0].env, ["TIDAL_REDIS_URL"]);
    assert!(has_flag("  --listen <LISTEN>", "--listen"));
    assert!(!has_flag("  --listen-x <X>", "--listen"));
    assert!(has_env("[env: TIDAL_REDIS_URL=]", "TIDAL_REDIS_URL"));
}

#[test]
#[should_panic(expected = "not a double-quoted")]
fn an_unquoted_flag_breaks_the_convention() {
    let text = "command: [\"tidal\"]\nargs:\n  - billing\n  - --listen=0.0.0.0:1\nenv:\n";
    invocations("t.yaml", text);
}

/// The controller's worker command line for each example Model and capacity type.
fn worker_command_lines(key_prefix: Option<&str>) -> Vec<(String, Vec<String>)> {
    let examples = [
        "llama-spot-fallback.yaml",
        "small-cpu-ondemand.yaml",
        "https-spot-with-base.yaml",
    ];
    let cfg = tidal_controller::deployment::WorkerConfig {
        queue_url: "redis://redis:6379/0".into(),
        key_prefix: key_prefix.map(str::to_string),
    };
    let mut out = Vec::new();
    for file in examples {
        let text =
            std::fs::read_to_string(root().join("crds/examples").join(file)).expect("example");
        let model: tidal_crds::Model = serde_yaml::from_str(&text).expect("a Model");
        let source = model.spec.source().expect("a valid source");
        for capacity in [CapacityType::Spot, CapacityType::OnDemand] {
            let args = tidal_controller::deployment::worker_args(&model, &source, capacity, &cfg);
            out.push((format!("{file} ({capacity:?})"), args));
        }
    }
    out
}

fn check_worker_flags(lines: &[(String, Vec<String>)]) {
    let help_text = help("runtime");
    for (what, args) in lines {
        assert_eq!(args[0], "runtime", "{what}: workers run `tidal runtime`");
        for flag in args.iter().filter(|a| a.starts_with("--")) {
            let flag = flag.split('=').next().unwrap_or(flag);
            assert!(
                has_flag(&help_text, flag),
                "{what}: the controller passes {flag}, which `tidal runtime` does not take"
            );
        }
    }
}

#[test]
fn the_worker_command_lines_the_controller_writes_are_runtime_options() {
    check_worker_flags(&worker_command_lines(None));
}

#[test]
fn a_custom_key_prefix_reaches_the_workers_as_a_runtime_option() {
    check_worker_flags(&worker_command_lines(Some("prod:")));
}
