//! The SQLite file with the real binary (security review, issue #36): one server per file
//! whatever spelling names it — a `sqlite:` URL with a query string, SQLite's own `file:` URI,
//! percent-encoding, a relative path, `..`, a symbolic link to the file or to its directory, a
//! hard link — refused before anything is opened, so the first server keeps its leases and its
//! write-ahead log; and a short-lived command (`token create`) leaves what it wrote in the
//! database file itself, not in the write-ahead log.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Api, create_token, free_port, serve};

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir.canonicalize().expect("canonical")
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// What became of a second `flotilla serve`: it exited (with its code and standard error), or
/// it served (then it was stopped with SIGTERM, as the review's newcomer was).
enum Second {
    Exited(Option<i32>, String),
    Served(String),
}

/// Starts a second server on `spelling` from `cwd` and waits, up to a deadline, until it exits
/// or answers `/readyz`.
fn second_server(cwd: &Path, spelling: &str, log: &Path) -> Second {
    let port = free_port();
    let out = std::fs::File::create(log).expect("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .current_dir(cwd)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--database", spelling])
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("starts");
    let http = reqwest::blocking::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Second::Exited(
                status.code(),
                std::fs::read_to_string(log).unwrap_or_default(),
            );
        }
        let ready = http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .timeout(Duration::from_secs(1))
            .send()
            .is_ok_and(|r| r.status().is_success());
        if ready || Instant::now() > deadline {
            sigterm(&child);
            let _ = child.wait();
            return Second::Served(std::fs::read_to_string(log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn leases(api: &Api) -> Vec<(Value, Value)> {
    let leases = api.must(reqwest::Method::GET, "/v1/leases", None);
    leases["value"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| (l["owner"].clone(), l["epoch"].clone()))
        .collect()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_second_server_is_refused_under_every_spelling_of_the_file() {
    let dir = temp_dir("spellings");
    let db = dir.join("a.db");
    let path = db.display().to_string();
    let token = create_token(&path);
    let port = free_port();
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token,
    };
    let mut first = serve(&path, port, &dir.join("first.log"), &[]);
    api.wait_ready();
    let driver = json!({"type": "sim", "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5"}});
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/kept",
        Some(&json!({"properties": {"driver": driver}})),
    );
    let held = leases(&api);
    assert_eq!(held.len(), 1, "{held:?}");

    // Other names of the same file, and of the directory it is in.
    std::fs::create_dir_all(dir.join("sub")).expect("sub");
    std::os::unix::fs::symlink(&db, dir.join("link.db")).expect("symlink");
    std::os::unix::fs::symlink(&dir, dir.join("linked-dir")).expect("dir symlink");
    std::fs::hard_link(&db, dir.join("hard.db")).expect("hard link");
    let before = entries(&dir);
    let d = dir.display();
    let spellings = [
        format!("sqlite://{path}?mode=rw"),
        format!("sqlite://{path}?mode=rwc&cache=private"),
        format!("file:{path}"),
        format!("file://{path}"),
        format!("file://localhost{path}?mode=rw"),
        format!("sqlite:file:{path}"),
        format!("sqlite:{path}"),
        format!("sqlite://{path}"),
        format!("sqlite://{d}/%61.db"),
        "a.db".to_string(),
        "./a.db".to_string(),
        "sqlite:./a.db".to_string(),
        format!("{d}/sub/../a.db"),
        format!("{d}//a.db"),
        "link.db".to_string(),
        format!("{d}/linked-dir/a.db"),
    ];
    // A hard link is the same file under a name of its own, which no resolution finds: the
    // lock on the file refuses it, named as given.
    let hard = dir.join("hard.db").display().to_string();
    let spellings = spellings
        .into_iter()
        .map(|s| (s, path.clone()))
        .chain([("hard.db".to_string(), hard)]);
    let mut wrong = Vec::new();
    for (i, (spelling, named)) in spellings.enumerate() {
        let log =
            std::env::temp_dir().join(format!("flotilla-spellings-{}-{i}.log", std::process::id()));
        match second_server(&dir, &spelling, &log) {
            Second::Exited(code, text)
                if code != Some(0)
                    && text.contains(&format!("another flotilla server is using {named};")) => {}
            Second::Exited(code, text) => wrong.push(format!(
                "{spelling}: exited {code:?} without naming {named} as in use: {text}"
            )),
            Second::Served(text) => {
                wrong.push(format!("{spelling}: served a second server: {text}"))
            }
        }
        let _ = std::fs::remove_file(&log);
        // The first server answers, with its write-ahead log and shared memory in place.
        let (status, _) = api
            .call(reqwest::Method::GET, "/v1/fleets/kept", None)
            .unwrap_or_else(|e| panic!("after {spelling}: the first server: {e}"));
        if status != 200 {
            wrong.push(format!(
                "after {spelling}: the first server answered {status}"
            ));
        }
        for file in ["a.db-wal", "a.db-shm"] {
            if !dir.join(file).exists() {
                wrong.push(format!("after {spelling}: {file} was deleted"));
            }
        }
    }
    // Nothing the newcomers did reached the first server's data, nor made files of their own.
    let after = leases(&api);
    if after != held {
        wrong.push(format!("the leases changed: {held:?} -> {after:?}"));
    }
    let now = entries(&dir);
    if now != before {
        wrong.push(format!("the directory changed: {before:?} -> {now:?}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Parameters that would open the file another way are refused by name, before it is
    // opened; the first server still runs.
    for (spelling, parameter) in [
        (format!("sqlite://{path}?vfs=unix-none"), "vfs"),
        (format!("file:{path}?nolock=1"), "nolock"),
        (format!("sqlite://{path}?immutable=1"), "immutable"),
        (format!("sqlite://{path}?mode=ro"), "mode"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .current_dir(&dir)
            .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--database", &spelling])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(parameter),
            "{spelling}: {:?} {stderr}",
            out.status
        );
    }
    api.must(reqwest::Method::GET, "/v1/fleets/kept", None);
    assert_eq!(leases(&api), held);

    // Once the first server is gone, any of them opens it.
    sigterm(&first);
    assert!(first.wait().expect("exits").success());
    let port = free_port();
    let api = Api {
        base: format!("http://127.0.0.1:{port}"),
        ..api
    };
    let mut again = serve(
        &format!("sqlite://{path}?mode=rw"),
        port,
        &dir.join("again.log"),
        &[],
    );
    api.wait_ready();
    api.must(reqwest::Method::GET, "/v1/fleets/kept", None);
    let _ = again.kill();
    let _ = again.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tokens in the database file `db` alone, opened read-only.
fn tokens_in(db: &Path) -> Result<i64, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        use sqlx::{Connection, Row};
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=ro", db.display()))
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query("SELECT count(*) FROM tokens")
            .fetch_one(&mut c)
            .await
            .map_err(|e| e.to_string())
            .map(|r| r.get(0))
    })
}

#[test]
fn a_token_created_offline_is_in_the_database_file_itself() {
    let dir = temp_dir("token-file");
    let db = dir.join("f.db");
    std::fs::create_dir_all(dir.join("copy")).expect("copy dir");
    let copy = dir.join("copy/f.db");
    // Each `token create` leaves the database file alone holding every token so far: copied
    // elsewhere without its write-ahead log, it has them all (a command that left them in the
    // log did so more often than not).
    let mut token = String::new();
    let mut wrong = Vec::new();
    for n in 1..=5 {
        token = create_token(&db.display().to_string());
        let wal = std::fs::metadata(dir.join("f.db-wal")).map_or(0, |m| m.len());
        std::fs::copy(&db, &copy).expect("copy");
        let counted = tokens_in(&copy);
        if counted != Ok(n) || wal > 0 {
            wrong.push(format!(
                "after token create {n}: {counted:?} tokens in the file alone, {wal} bytes left in f.db-wal"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // And a server on the copy takes the last token.
    let port = free_port();
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token,
    };
    let mut server = serve(
        &copy.display().to_string(),
        port,
        &dir.join("copy.log"),
        &[],
    );
    api.wait_ready();
    let me = api.must(reqwest::Method::GET, "/v1/me", None);
    assert_eq!(me["subject"], "process-test", "{me}");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
