//! The documentation (`README.md` and `docs/*.md`) against the repository:
//!
//! - **Links.** Every relative link (`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`
//!   and reference definitions `[name]: path`) names a file or folder that exists, and an
//!   anchor into a Markdown file names one of its headings (GitHub's slugs: lower case,
//!   punctuation dropped, spaces as `-`, `-1`, `-2` ... for repeats).
//! - **Commands.** Every fenced shell block (info string `sh`, `bash`, `shell` or `console`)
//!   says whether the test suite runs it, in its info string:
//!
//!   ````markdown
//!   ```sh tested-by: tests/up_e2e.rs, tests/gateway_openai_client.rs
//!   cargo run --release -- up
//!   ```
//!
//!   ```sh not-run: needs a Kubernetes cluster
//!   helm install tidal charts/tidal -n tidal
//!   ```
//!   ````
//!
//!   `tested-by:` names the test files (which must exist) that run those commands or the
//!   path they stand for; `not-run:` gives the reason they cannot run here (a cluster, a GPU,
//!   a download, a long benchmark), which must not be empty. A block with neither fails.
//!   In every block, marked either way, each `tidal` command line (`tidal ...`,
//!   `cargo run [--release] -- ...`, a path ending in `/tidal`, or a variable assigned one)
//!   must parse with the CLI's clap definition, so a renamed or removed flag fails here;
//!   `bash scripts/X` must name an existing script and `cargo test --test X` an existing
//!   test target.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use clap::CommandFactory;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, as paths relative to the repository root.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![PathBuf::from("README.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("reading docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| PathBuf::from("docs").join(p.file_name().expect("a file name")))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// A fenced code block.
struct Fence {
    /// 1-based line of the opening fence.
    line: usize,
    info: String,
    body: Vec<String>,
}

/// A document split into prose lines (with their numbers) and fenced blocks.
struct Parsed {
    prose: Vec<(usize, String)>,
    fences: Vec<Fence>,
}

fn parse(text: &str) -> Parsed {
    let mut prose = Vec::new();
    let mut fences = Vec::new();
    let mut open: Option<(String, Fence)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker: String = trimmed
            .chars()
            .take_while(|c| *c == '`' || *c == '~')
            .collect();
        let is_marker = marker.len() >= 3
            && (marker.chars().all(|c| c == '`') || marker.chars().all(|c| c == '~'));
        match open.take() {
            Some((fence_marker, mut fence)) => {
                if is_marker
                    && marker.starts_with(&fence_marker)
                    && trimmed[marker.len()..].trim().is_empty()
                {
                    fences.push(fence);
                } else {
                    fence.body.push(line.to_owned());
                    open = Some((fence_marker, fence));
                }
            }
            None if is_marker => {
                let fence = Fence {
                    line: i + 1,
                    info: trimmed[marker.len()..].trim().to_owned(),
                    body: Vec::new(),
                };
                open = Some((marker, fence));
            }
            None => prose.push((i + 1, line.to_owned())),
        }
    }
    if let Some((_, fence)) = open {
        fences.push(fence);
    }
    Parsed { prose, fences }
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a document's headings.
fn anchors(parsed: &Parsed) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in &parsed.prose {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The line without its inline code spans (links inside backticks are not links).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// Link targets on a prose line: inline links and reference definitions.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        if let Some(end) = trimmed.find("]: ") {
            out.push(trimmed[end + 3..].trim().to_owned());
        }
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.trim_matches(|c| c == '<' || c == '>').to_owned());
        rest = &after[end..];
    }
    out
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

#[test]
fn relative_links_resolve() {
    let root = root();
    let mut parsed: BTreeMap<PathBuf, Parsed> = BTreeMap::new();
    for doc in documents() {
        let text = std::fs::read_to_string(root.join(&doc)).expect("reading a document");
        parsed.insert(doc, parse(&text));
    }
    let mut anchor_cache: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut broken = Vec::new();
    let mut checked = 0usize;
    for (doc, p) in &parsed {
        for (line_no, line) in &p.prose {
            for target in link_targets(line) {
                if target.is_empty() || is_external(&target) {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    doc.clone()
                } else {
                    let dir = doc.parent().unwrap_or(Path::new(""));
                    normalise(&dir.join(path))
                };
                if !root.join(&file).exists() {
                    broken.push(format!(
                        "{}:{line_no}: {target}: no such file",
                        doc.display()
                    ));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if file.extension().is_none_or(|x| x != "md") {
                    continue;
                }
                let known =
                    anchor_cache
                        .entry(file.clone())
                        .or_insert_with(|| match parsed.get(&file) {
                            Some(p) => anchors(p),
                            None => {
                                let text =
                                    std::fs::read_to_string(root.join(&file)).unwrap_or_default();
                                anchors(&parse(&text))
                            }
                        });
                if !known.contains(anchor) {
                    broken.push(format!(
                        "{}:{line_no}: {target}: no heading with anchor #{anchor} in {}",
                        doc.display(),
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(checked > 0, "no relative link found: the parser is broken");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `a/../b` → `b`, `./a` → `a` (the paths need not exist).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Splits a shell line into words: quotes and backslashes as the shell reads them;
/// `$(...)` and variables are kept as text.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(n) = chars.next() {
                                word.push(n);
                            }
                        }
                        _ => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The block's logical lines: continuations joined, comments and blank lines dropped, each
/// split at `&&`, `||`, `;` and `|` into simple commands.
fn commands(body: &[String]) -> Vec<String> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in body {
        let line = strip_comment(line);
        if let Some(head) = line.trim_end().strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(&line);
        logical.push(std::mem::take(&mut current));
    }
    if !current.trim().is_empty() {
        logical.push(current);
    }
    let mut out = Vec::new();
    for line in logical {
        for part in split_outside_quotes(&line) {
            let part = part.trim().trim_end_matches('&').trim().to_owned();
            if !part.is_empty() {
                out.push(part);
            }
        }
    }
    out
}

/// The line up to an unquoted ` #` comment.
fn strip_comment(line: &str) -> String {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return line[..i].to_owned(),
            _ => {}
        }
        prev = c;
    }
    line.to_owned()
}

/// Splits at `&&`, `||`, `;` and `|` outside quotes and `$(...)`.
fn split_outside_quotes(line: &str) -> Vec<String> {
    let (mut single, mut double, mut depth) = (false, false, 0usize);
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '(' if !single && !double => depth += 1,
            ')' if !single && !double => depth = depth.saturating_sub(1),
            ';' | '|' | '&' if !single && !double && depth == 0 => {
                if c == '&' && chars.peek() != Some(&'&') {
                    part.push(c);
                    continue;
                }
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                parts.push(std::mem::take(&mut part));
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
    parts.push(part);
    parts
}

/// What the block's info string says about running it.
enum Marking {
    TestedBy(Vec<String>),
    NotRun(String),
    Unmarked,
}

fn marking(info: &str) -> Marking {
    let rest = info
        .split_once(char::is_whitespace)
        .map_or("", |(_, r)| r.trim());
    if let Some(files) = rest.strip_prefix("tested-by:") {
        return Marking::TestedBy(
            files
                .split(',')
                .map(|f| f.trim().to_owned())
                .filter(|f| !f.is_empty())
                .collect(),
        );
    }
    if let Some(reason) = rest.strip_prefix("not-run:") {
        return Marking::NotRun(reason.trim().to_owned());
    }
    Marking::Unmarked
}

fn is_shell(info: &str) -> bool {
    matches!(
        info.split_whitespace().next(),
        Some("sh" | "bash" | "shell" | "console")
    )
}

/// The `tidal` arguments of a simple command, if it runs `tidal`; `tidal_vars` are the
/// shell variables assigned a path to the binary earlier in the block.
fn tidal_args(words: &[String], tidal_vars: &BTreeSet<String>) -> Option<Vec<String>> {
    let is_tidal = |w: &str| {
        !w.contains('=')
            && (w == "tidal"
                || w.ends_with("/tidal")
                || w.strip_prefix('$')
                    .map(|v| v.trim_matches(|c| c == '{' || c == '}'))
                    .is_some_and(|v| tidal_vars.contains(v)))
    };
    if words.len() >= 2 && words[0] == "cargo" && words[1] == "run" {
        let sep = words.iter().position(|w| w == "--")?;
        let flags = &words[2..sep];
        let other_target = flags
            .iter()
            .any(|w| w == "-p" || w == "--package" || w == "--example" || w == "--bin");
        return (!other_target).then(|| words[sep + 1..].to_vec());
    }
    // Only a command word runs the binary (not `helm install tidal charts/tidal`): the first
    // word after environment assignments and wrappers, or the first after `--`
    // (`kubectl exec deploy/x -- tidal ...`).
    let runs = |at: usize| {
        words[..at].iter().all(|w| {
            (w.contains('=') && !w.starts_with('-'))
                || matches!(w.as_str(), "exec" | "time" | "env" | "nohup")
        }) || (at > 0 && words[at - 1] == "--")
    };
    let at = (0..words.len()).find(|&i| is_tidal(&words[i]) && runs(i))?;
    Some(words[at + 1..].to_vec())
}

/// The CLI with every flag that reads an environment variable made optional: a shell
/// block may rely on the environment (an `export` above it, a container's `env:`).
fn cli_without_env_requirements() -> clap::Command {
    fn relax(cmd: clap::Command) -> clap::Command {
        cmd.mut_args(|a| {
            if a.get_env().is_some() {
                a.required(false)
            } else {
                a
            }
        })
        .mut_subcommands(relax)
    }
    relax(tidal::cli::Cli::command())
}

/// Parses `tidal ARGS`. A value the shell fills in (`--cpu-kernel $k`) cannot be checked and
/// passes; everything else must parse.
fn parse_tidal(cli: &clap::Command, args: Vec<String>) -> Result<(), String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let argv = std::iter::once("tidal".to_owned()).chain(args);
    let Err(e) = cli.clone().try_get_matches_from(argv) else {
        return Ok(());
    };
    let from_shell = matches!(
        e.get(ContextKind::InvalidValue),
        Some(ContextValue::String(v)) if v.contains('$')
    );
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Ok(()),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation if from_shell => Ok(()),
        _ => Err(e.to_string().lines().next().unwrap_or("").to_owned()),
    }
}

/// The words without shell redirections (`> cpu.json`, `2>&1`).
fn without_redirections(words: Vec<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for w in words {
        if skip_next {
            skip_next = false;
            continue;
        }
        let op = w.trim_start_matches(|c: char| c.is_ascii_digit());
        if op.starts_with('>') || op.starts_with('<') {
            // `>` alone takes the next word; `>file` and `2>&1` carry their target.
            skip_next = matches!(op, ">" | ">>" | "<");
            continue;
        }
        out.push(w);
    }
    out
}

#[test]
fn shell_blocks_are_marked_and_their_commands_parse() {
    let root = root();
    let cli = cli_without_env_requirements();
    let mut problems = Vec::new();
    let (mut blocks, mut parsed_lines) = (0usize, 0usize);
    for doc in documents() {
        let text = std::fs::read_to_string(root.join(&doc)).expect("reading a document");
        for fence in parse(&text).fences.iter().filter(|f| is_shell(&f.info)) {
            blocks += 1;
            let at = format!("{}:{}", doc.display(), fence.line);
            match marking(&fence.info) {
                Marking::Unmarked => problems.push(format!(
                    "{at}: shell block without `tested-by: FILE` or `not-run: REASON` in its info string"
                )),
                Marking::NotRun(reason) if reason.is_empty() => {
                    problems.push(format!("{at}: `not-run:` without a reason"))
                }
                Marking::NotRun(_) => {}
                Marking::TestedBy(files) if files.is_empty() => {
                    problems.push(format!("{at}: `tested-by:` names no file"))
                }
                Marking::TestedBy(files) => {
                    for f in files.iter().filter(|f| !root.join(f).exists()) {
                        problems.push(format!("{at}: tested-by {f}: no such file"));
                    }
                }
            }
            let mut tidal_vars = BTreeSet::new();
            for command in commands(&fence.body) {
                let words = without_redirections(shell_words(&command));
                let Some(first) = words.first() else { continue };
                if let Some((var, value)) = first.split_once('=') {
                    if words.len() == 1
                        && !var.is_empty()
                        && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && value.ends_with("/tidal")
                    {
                        tidal_vars.insert(var.to_owned());
                    }
                }
                if let Some(args) = tidal_args(&words, &tidal_vars) {
                    parsed_lines += 1;
                    if let Err(e) = parse_tidal(&cli, args) {
                        problems.push(format!("{at}: `{command}`: {e}"));
                    }
                }
                let script = words
                    .iter()
                    .position(|w| w == "bash" || w == "sh" || w.ends_with("$(bash"))
                    .and_then(|i| words.get(i + 1))
                    .map(|w| w.trim_end_matches(')'))
                    .filter(|w| w.starts_with("scripts/"));
                if let Some(script) = script {
                    if !root.join(script).exists() {
                        problems.push(format!("{at}: {script}: no such script"));
                    }
                }
                if words.len() >= 2 && words[0] == "cargo" && words[1] == "test" {
                    let test = words
                        .iter()
                        .position(|w| w == "--test")
                        .and_then(|i| words.get(i + 1));
                    if let Some(test) = test {
                        let exists = std::fs::read_dir(&root)
                            .into_iter()
                            .flatten()
                            .filter_map(|e| e.ok())
                            .map(|e| e.path().join("tests").join(format!("{test}.rs")))
                            .chain([root.join("tests").join(format!("{test}.rs"))])
                            .any(|p| p.exists());
                        if !exists {
                            problems.push(format!("{at}: cargo test --test {test}: no such test"));
                        }
                    }
                }
            }
        }
    }
    assert!(blocks > 0, "no shell block found: the parser is broken");
    assert!(
        parsed_lines > 0,
        "no tidal command found: the parser is broken"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_helpers_read_shell_and_markdown_as_expected() {
    assert_eq!(
        shell_words(r#"tidal models put smol --gguf "$M" --x 'a b' c\ d"#),
        ["tidal", "models", "put", "smol", "--gguf", "$M", "--x", "a b", "c d"]
    );
    assert_eq!(
        commands(&[
            "M=$(bash scripts/fetch-model.sh)   # a comment".into(),
            "tidal up \\".into(),
            "  --listen 127.0.0.1:8080 && tidal status &".into(),
        ]),
        [
            "M=$(bash scripts/fetch-model.sh)",
            "tidal up    --listen 127.0.0.1:8080",
            "tidal status"
        ]
    );
    let none = BTreeSet::new();
    let words = |s: &str| shell_words(s);
    assert_eq!(
        tidal_args(&words("cargo run --release -- up --model x"), &none),
        Some(words("up --model x"))
    );
    assert_eq!(
        tidal_args(&words("cargo run -p tidal-gateway --example b -- 1"), &none),
        None
    );
    assert_eq!(
        tidal_args(&words("kubectl exec deploy/g -- tidal keys list"), &none),
        Some(words("keys list"))
    );
    assert_eq!(
        tidal_args(&words("helm install tidal charts/tidal"), &none),
        None
    );
    let vars: BTreeSet<String> = ["B".to_owned()].into();
    assert_eq!(
        tidal_args(&words("$B bench decode"), &vars),
        Some(words("bench decode"))
    );
    assert_eq!(
        slug("`tidal keys create-tenant`"),
        "tidal-keys-create-tenant"
    );
    assert_eq!(
        slug("What is billed when something fails"),
        "what-is-billed-when-something-fails"
    );
    assert_eq!(slug("Errors: what to do"), "errors-what-to-do");
    assert_eq!(
        link_targets("see [a](docs/a.md#x) and `[b](not/a/link)` and [c](https://e.org)"),
        ["docs/a.md#x", "https://e.org"]
    );
    let p = parse("# A\n## A\n```sh not-run: x\n# not a heading\n```\n");
    assert_eq!(anchors(&p).into_iter().collect::<Vec<_>>(), ["a", "a-1"]);
    assert_eq!(p.fences[0].info, "sh not-run: x");
    assert!(matches!(marking("sh not-run: needs a GPU"), Marking::NotRun(r) if r == "needs a GPU"));
    assert!(matches!(marking("sh"), Marking::Unmarked));
}

#[test]
fn a_drifted_flag_fails_to_parse() {
    // The check above is only as good as clap's refusal of an unknown flag.
    let cli = tidal::cli::Cli::command();
    assert!(cli
        .clone()
        .try_get_matches_from(["tidal", "up", "--no-such-flag"])
        .is_err());
    assert!(cli
        .try_get_matches_from(["tidal", "status", "--json"])
        .is_ok());
    // A flag the environment can supply may be left out; any other required one may not.
    let relaxed = cli_without_env_requirements();
    assert!(parse_tidal(&relaxed, argv(&["gateway"])).is_ok());
    assert!(parse_tidal(&relaxed, argv(&["keys", "issue"])).is_err());
    assert!(parse_tidal(
        &relaxed,
        argv(&["bench", "concurrency", "--cpu-kernel", "$k"])
    )
    .is_ok());
    assert!(parse_tidal(
        &relaxed,
        argv(&["bench", "concurrency", "--cpu-kernel", "nope"])
    )
    .is_err());
}

fn argv(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}
