//! `flotilla demo` as a real process: on SIGTERM it stops its server, closes its store and
//! leaves nothing behind (its `flotilla-demo-PID` directory, SQLite's write-ahead log with it,
//! is removed).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Killed, TempDir, free_port, wait_for};

#[test]
fn the_demo_removes_its_directory_on_sigterm() {
    // The demo makes its directory under the temporary directory: a folder of this test's.
    let tmp = TempDir::new("demo");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "demo",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--time-scale",
            "60",
        ])
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo starts");
    let mut demo = Killed(child);
    let dir = tmp.path().join(format!("flotilla-demo-{}", demo.0.id()));
    // It serves: its addresses and its database are printed once the fleet is made.
    let stdout = demo.0.stdout.take().expect("stdout");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut printed = String::new();
    while !printed.contains("database:") {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => printed.push_str(&(line + "\n")),
            Err(e) => panic!("the demo printed no database line ({e}):\n{printed}"),
        }
    }
    assert!(
        printed.contains(&dir.join("flotilla.db").display().to_string()),
        "the demo's database is in {}:\n{printed}",
        dir.display()
    );
    let answer = reqwest::blocking::get(format!("http://127.0.0.1:{port}/healthz"))
        .expect("the demo's server answers");
    assert!(answer.status().is_success(), "{}", answer.status());
    assert!(dir.join("flotilla.db").exists(), "the database is there");
    assert!(
        dir.join("flotilla.db-wal").exists(),
        "SQLite writes ahead while the demo runs"
    );
    let killed = Command::new("kill")
        .args(["-TERM", &demo.0.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let mut exit = None;
    wait_for("the demo to exit", Duration::from_secs(20), || {
        exit = demo.0.try_wait().expect("wait");
        exit.is_some()
    });
    let exit = exit.expect("exited");
    assert!(exit.success(), "the demo exits cleanly on SIGTERM: {exit}");
    assert!(
        !dir.exists(),
        "the demo's directory is removed: {:?}",
        std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
}
