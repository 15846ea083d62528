//! Tidy checks as ordinary tests: every Rust file says what it owns in a `//!` line; no debug
//! prints, ignored tests or stubs; the engine stays pure (no clock, no I/O, no async runtime).

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_file_is_tidy() {
    let mut files = Vec::new();
    rust_files(&workspace().join("crates"), &mut files);
    assert!(files.len() > 10, "found only {} Rust files", files.len());
    let mut problems = Vec::new();
    // Built from pieces so this file does not trip its own checks.
    let banned = [
        ["db", "g!("].concat(),
        ["#[", "ignore]"].concat(),
        ["to", "do!("].concat(),
        ["unimple", "mented!("].concat(),
    ];
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable");
        if !text.trim_start().starts_with("//!") {
            problems.push(format!(
                "{}: does not start with a //! line saying what it owns",
                file.display()
            ));
        }
        for b in &banned {
            if text.contains(b.as_str()) {
                problems.push(format!("{}: contains {b}", file.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_server_modules_form_no_cycle() {
    // Each module of the server names the modules it uses as `crate::name` (the root, lib.rs,
    // also by their bare names); a module's submodules (`api/…`) count as the module. The
    // crates the root re-exports (`driver`, `clock`, `operation`, `store`) are leaves. A cycle
    // means a type lives in the wrong module.
    let src = workspace().join("crates/flotilla-server/src");
    fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("server sources").flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    sources(&src, &mut files);
    let module_of = |path: &std::path::Path| -> String {
        let relative = path.strip_prefix(&src).expect("under src");
        let first = relative.components().next().expect("a component");
        let first = first.as_os_str().to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    };
    let modules: std::collections::BTreeSet<String> = files.iter().map(|p| module_of(p)).collect();
    let leaves = ["driver", "clock", "operation", "store"];
    let mut uses: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for path in &files {
        let name = module_of(path);
        let text = std::fs::read_to_string(path).expect("readable");
        let mut deps: Vec<String> = text
            .match_indices("crate::")
            .map(|(i, _)| {
                text[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .collect();
        if name == "lib" {
            // The root names its modules bare: `runs::Runs`, `feed::trigger_profiles(…)`.
            deps.extend(
                modules
                    .iter()
                    .filter(|m| text.contains(&format!("{m}::")))
                    .cloned(),
            );
        }
        let entry = uses.entry(name.clone()).or_default();
        entry.extend(
            deps.into_iter()
                .filter(|d| *d != name && !d.is_empty() && !leaves.contains(&d.as_str())),
        );
        entry.sort();
        entry.dedup();
    }
    assert!(uses.len() > 5, "found only {} server modules", uses.len());
    fn visit(
        m: &str,
        uses: &std::collections::BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if !done.insert(m.to_string()) {
            return None;
        }
        path.push(m.to_string());
        for d in uses.get(m).into_iter().flatten() {
            if let Some(cycle) = visit(d, uses, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = Default::default();
    for m in uses.keys() {
        if let Some(cycle) = visit(m, &uses, &mut Vec::new(), &mut done) {
            panic!("the server's modules form a cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_engine_is_pure() {
    let root = workspace().join("crates/flotilla-engine");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("manifest");
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .unwrap_or_default()
        .split("\n[")
        .next()
        .unwrap_or_default();
    let allowed = [
        "serde",
        "serde_json",
        "serde_path_to_error",
        "jiff",
        "thiserror",
    ];
    for line in deps
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
        assert!(
            allowed.contains(&name),
            "the engine must not depend on {name}: it does no I/O and reads no clock"
        );
    }
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let forbidden = [
        "SystemTime",
        "Instant::now",
        "std::fs",
        "std::net",
        "std::thread",
        "tokio",
        "std::process",
        "Timestamp::now",
    ];
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for f in forbidden {
            assert!(
                !text.contains(f),
                "{} uses {f}: the engine is pure",
                file.display()
            );
        }
    }
}

/// The repository carries copies of the shared conformance suite and example so that a clone
/// alone passes its tests; where the shared folder sits beside the checkout, the copies must be
/// the same bytes (a newer shared suite is copied in, never edited here).
#[test]
fn copies_of_the_shared_suite_match_it() {
    let shared = workspace().join("../shared");
    if !shared.is_dir() {
        eprintln!(
            "tidy: no ../shared beside the checkout; the copies in tests/conformance stand alone"
        );
        return;
    }
    let pairs = std::fs::read_dir(shared.join("conformance"))
        .expect("shared conformance")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "yaml" || x == "py" || x == "sh")
        })
        .map(|p| {
            let copy = workspace()
                .join("tests/conformance")
                .join(p.file_name().expect("a file name"));
            (p, copy)
        })
        .chain([
            (
                shared.join("conformance/README.md"),
                workspace().join("tests/conformance/FORMAT.md"),
            ),
            (
                shared.join("examples/fleet-stages.json"),
                workspace().join("examples/fleet-stages.json"),
            ),
            (
                shared.join("spec/API.md"),
                workspace().join("docs/spec/API.md"),
            ),
            (
                shared.join("spec/SEMANTICS.md"),
                workspace().join("docs/spec/SEMANTICS.md"),
            ),
            (
                shared.join("spec/STYLE.md"),
                workspace().join("docs/spec/STYLE.md"),
            ),
            (
                shared.join("spec/ENGINE-DESIGN.md"),
                workspace().join("docs/spec/ENGINE-DESIGN.md"),
            ),
            (
                shared.join("spec/FLEET-DESIGN.md"),
                workspace().join("docs/spec/FLEET-DESIGN.md"),
            ),
        ]);
    let mut stale = Vec::new();
    for (original, copy) in pairs {
        if std::fs::read(&original).ok() != std::fs::read(&copy).ok() {
            stale.push(format!(
                "{} differs from {}",
                copy.display(),
                original.display()
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "copy the shared files again:\n{}",
        stale.join("\n")
    );
}

/// `flotilla <path> --help`, as a user reads it (no environment variable set shows a value).
fn help(path: &[String]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(path)
        .arg("--help")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("COLUMNS", "100")
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "flotilla {} --help", path.join(" "));
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The subcommands a help text lists.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

/// docs/cli.md is the command line's own help, every command and flag of it, so the reference
/// never drifts from the binary (#42). `FLOTILLA_BLESS=1 cargo test -p flotilla --test tidy`
/// writes it again after a change to the command line.
#[test]
fn the_cli_reference_is_the_cli_s_own_help() {
    let mut doc = String::from(
        "# The command line, command by command\n\n\
         Every command of `flotilla` and every flag, as `--help` prints them (a flag's environment\n\
         variable is named in brackets). Written from the binary by\n\
         `FLOTILLA_BLESS=1 cargo test -p flotilla --test tidy`; a test fails when it differs.\n",
    );
    let mut paths: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = paths.pop() {
        let text = help(&path);
        let title = if path.is_empty() {
            "flotilla".to_string()
        } else {
            format!("flotilla {}", path.join(" "))
        };
        doc.push_str(&format!("\n## `{title}`\n\n```text\n{}```\n", text));
        // Depth first, in the order the help lists them.
        for sub in subcommands(&text).into_iter().rev() {
            let mut next = path.clone();
            next.push(sub);
            paths.push(next);
        }
    }
    let file = workspace().join("docs/cli.md");
    if std::env::var_os("FLOTILLA_BLESS").is_some() {
        std::fs::write(&file, &doc).expect("docs/cli.md written");
        return;
    }
    let written = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        written == doc,
        "docs/cli.md is not the command line's help: write it again with\n  FLOTILLA_BLESS=1 cargo test -p flotilla --test tidy"
    );
}

/// The markdown files a reader follows links through: the README, the top-level notes and the
/// pages of docs/ (docs/spec/ is a copy of the shared spec, checked byte for byte above).
fn documentation() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]
        .iter()
        .map(|f| workspace().join(f))
        .collect();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(workspace().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

/// The lines of a markdown file outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The anchors GitHub gives a markdown file's headings: lower case, letters, digits, `-` and
/// `_` kept, spaces as `-`, everything else dropped; a repeated heading gets `-1`, `-2`, ...
fn anchors(text: &str) -> std::collections::BTreeSet<String> {
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let mut anchors = std::collections::BTreeSet::new();
    for line in prose(text) {
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        let title = title.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let count = seen.entry(slug.clone()).or_default();
        anchors.insert(if *count == 0 {
            slug.clone()
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// The targets of a markdown file's inline links, `[text](target)`, outside code blocks.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            targets.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    targets
}

/// Every relative link of the README and docs/ names a file that exists, and a heading of it
/// where it names one (#42): pages move, and a link left behind is a dead end for the reader.
/// Every flag of every command is documented already: docs/cli.md is the help itself (above).
#[test]
fn every_relative_link_of_the_documentation_resolves() {
    let files = documentation();
    assert!(files.len() > 5, "found only {} pages", files.len());
    let mut broken = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("a directory").join(path)
            };
            let shown = format!("{}: ({target})", file.display());
            if !linked.exists() {
                broken.push(format!("{shown}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor
                && linked.extension().is_some_and(|e| e == "md")
            {
                let page = std::fs::read_to_string(&linked).expect("readable");
                if !anchors(&page).contains(anchor) {
                    broken.push(format!("{shown}: no heading with the anchor #{anchor}"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links that lead nowhere:\n{}",
        broken.join("\n")
    );
}

/// CI runs the test command the README gives (`.ci/run`), so a reader runs what CI runs.
#[test]
fn the_readme_s_test_command_is_ci_s() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
    let ci = std::fs::read_to_string(workspace().join(".ci/run")).expect(".ci/run");
    let command = "cargo test --workspace";
    assert!(
        readme.lines().any(|l| l.trim() == command),
        "README.md must give `{command}` on a line of its own"
    );
    assert!(
        ci.lines().any(|l| l.trim() == command),
        ".ci/run must run `{command}`, the README's test command"
    );
}

#[test]
fn anchors_and_links_are_read_as_github_reads_them() {
    let page = concat!(
        "# Operating the server\n## Several replicas (PostgreSQL)\n",
        "```\n# not a heading\n```\n",
        "## Fleet Manager's ARM paths\n## `flotilla serve`\n## Notes\n## Notes\n",
    );
    let found = anchors(page);
    for anchor in [
        "operating-the-server",
        "several-replicas-postgresql",
        "fleet-managers-arm-paths",
        "flotilla-serve",
        "notes",
        "notes-1",
    ] {
        assert!(found.contains(anchor), "{anchor} in {found:?}");
    }
    assert!(!found.contains("not-a-heading"), "{found:?}");
    assert_eq!(
        link_targets("see [a](a.md#x) and [b](../b.md)\n```\n[c](c.md)\n```\n"),
        ["a.md#x", "../b.md"]
    );
}
