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
