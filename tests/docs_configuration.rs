//! `docs/configuration.md` is generated from the clap definitions of `tidal` (the same
//! `Command` the binary parses), so it cannot drift from the flags: this test renders every
//! subcommand's flags, positional arguments, defaults, environment variables and help text,
//! and fails when the file differs. `TIDAL_BLESS=1 cargo test --test docs_configuration`
//! rewrites the part of the file below the marker; the hand-written intro above it stays.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Arg, ArgAction, CommandFactory};

/// The line that separates the hand-written intro from the generated reference.
const MARKER: &str = "<!-- Generated from the clap definitions by tests/docs_configuration.rs: \
edit the doc comments in src/cli (or autoscaler/src/sim/cli.rs), then run \
`TIDAL_BLESS=1 cargo test --test docs_configuration`. -->";

/// Intro written when the file does not exist yet.
const DEFAULT_INTRO: &str = "# Configuration reference\n";

fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md")
}

/// Text of one table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    let joined = text
        .split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    joined.replace('|', "\\|")
}

/// Help text of a command or argument, long form preferred.
fn help_of(
    long: Option<&clap::builder::StyledStr>,
    short: Option<&clap::builder::StyledStr>,
) -> String {
    long.or(short).map(|s| s.to_string()).unwrap_or_default()
}

/// How the argument is written on the command line.
fn spelling(arg: &Arg) -> String {
    let value = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map(|n| n.to_string())
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
    if arg.is_positional() {
        let name = format!("<{value}>");
        return if arg.is_required_set() {
            format!("`{name}`")
        } else {
            format!("`[{name}]`")
        };
    }
    let mut names = Vec::new();
    if let Some(long) = arg.get_long() {
        names.push(format!("--{long}"));
    }
    if let Some(aliases) = arg.get_visible_aliases() {
        names.extend(aliases.into_iter().map(|a| format!("--{a}")));
    }
    if let Some(short) = arg.get_short() {
        names.push(format!("-{short}"));
    }
    let takes_value = matches!(arg.get_action(), ArgAction::Set | ArgAction::Append);
    let first = names.first().cloned().unwrap_or_default();
    let mut out = if takes_value {
        format!("`{first} <{value}>`")
    } else {
        format!("`{first}`")
    };
    for other in names.iter().skip(1) {
        let _ = write!(out, ", `{other}`");
    }
    if matches!(arg.get_action(), ArgAction::Append) {
        out.push_str(" (repeatable)");
    }
    if arg.is_required_set() {
        out.push_str(" (required)");
    }
    out
}

fn default_of(arg: &Arg) -> String {
    match arg.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count => return "off".into(),
        ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version => {
            return String::new()
        }
        _ => {}
    }
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect();
    if values.is_empty() {
        "—".into()
    } else {
        values.join(", ")
    }
}

fn env_of(arg: &Arg) -> String {
    arg.get_env()
        .map(|e| format!("`{}`", e.to_string_lossy()))
        .unwrap_or_else(|| "—".into())
}

fn meaning_of(arg: &Arg) -> String {
    let mut text = cell(&help_of(arg.get_long_help(), arg.get_help()));
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !values.is_empty() {
        if !text.is_empty() {
            text.push(' ');
        }
        let _ = write!(text, "One of {}.", values.join(", "));
    }
    text
}

/// Renders one command and, below it, its subcommands.
fn render(out: &mut String, cmd: &clap::Command, path: &str, depth: usize) {
    let heading = "#".repeat(depth.min(4));
    let _ = writeln!(out, "{heading} `{path}`\n");
    let about = cell(&help_of(cmd.get_long_about(), cmd.get_about()));
    if !about.is_empty() {
        let _ = writeln!(out, "{about}\n");
    }
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter(|a| {
            !matches!(
                a.get_action(),
                ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
            )
        })
        .collect();
    if !args.is_empty() {
        out.push_str("| argument | default | env | meaning |\n| --- | --- | --- | --- |\n");
        for arg in args {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                spelling(arg),
                default_of(arg),
                env_of(arg),
                meaning_of(arg)
            );
        }
        out.push('\n');
    }
    let subs: Vec<&clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    if !subs.is_empty() && depth > 1 {
        let names: Vec<String> = subs.iter().map(|s| format!("`{}`", s.get_name())).collect();
        let _ = writeln!(out, "Subcommands: {}.\n", names.join(", "));
    }
    for sub in subs {
        render(out, sub, &format!("{path} {}", sub.get_name()), depth + 1);
    }
}

/// The generated part of the file.
fn generated() -> String {
    let mut cmd = tidal::cli::Cli::command();
    cmd.build();
    let mut out = String::new();
    let names: Vec<String> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| format!("[`{0}`](#tidal-{0})", s.get_name()))
        .collect();
    let _ = writeln!(out, "Subcommands: {}.\n", names.join(", "));
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        render(&mut out, sub, &format!("tidal {}", sub.get_name()), 2);
    }
    out.trim_end().to_string() + "\n"
}

#[test]
fn configuration_reference_matches_the_cli() {
    let path = doc_path();
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    let intro = match current.find(MARKER) {
        Some(at) => current[..at].to_string(),
        None if current.is_empty() => format!("{DEFAULT_INTRO}\n"),
        None => panic!("{} has no generated marker line:\n{MARKER}", path.display()),
    };
    let expected = format!("{intro}{MARKER}\n\n{}", generated());
    if std::env::var_os("TIDAL_BLESS").is_some() {
        std::fs::write(&path, &expected).expect("writing docs/configuration.md");
        return;
    }
    if current != expected {
        let first_diff = current
            .lines()
            .zip(expected.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| current.lines().count().min(expected.lines().count()));
        panic!(
            "docs/configuration.md differs from the CLI's flags (first at line {}): \
             run `TIDAL_BLESS=1 cargo test --test docs_configuration` and commit the result.\n\
             expected: {:?}\n     got: {:?}",
            first_diff + 1,
            expected.lines().nth(first_diff),
            current.lines().nth(first_diff)
        );
    }
}

#[test]
fn every_flag_has_help() {
    // A flag without a help line would be a row with an empty meaning in the reference.
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut cmd = tidal::cli::Cli::command();
    cmd.build();
    let mut missing = Vec::new();
    walk(&cmd, "tidal", &mut missing);
    assert!(
        missing.is_empty(),
        "flags without a help line: {missing:#?}"
    );
}
