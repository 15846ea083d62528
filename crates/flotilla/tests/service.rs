//! Running the server as a service (#42): a configuration file (every flag settable there, flag
//! over environment over file, unknown keys refused, `--print-config`), log lines plain when not
//! on a terminal or JSON with `--log-format json`, and a clean shutdown said at INFO.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Killed, TempDir, free_port, wait_for};

fn flotilla() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    for var in [
        "FLOTILLA_LISTEN",
        "FLOTILLA_DATABASE",
        "FLOTILLA_LEASE_TTL",
        "FLOTILLA_LOG",
        "FLOTILLA_LOG_FORMAT",
        "FLOTILLA_SERVE_CONFIG",
        "FLOTILLA_INSECURE_NO_AUTH",
    ] {
        c.env_remove(var);
    }
    c
}

fn toml_of(text: &str) -> toml::Table {
    toml::from_str(text).unwrap_or_else(|e| panic!("not TOML ({e}): {text}"))
}

#[test]
fn the_configuration_file_sets_any_flag_under_the_environment_and_the_command_line() {
    let dir = TempDir::new("config");
    let file = dir.path().join("flotilla.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:9001\"\nlease_ttl = 5\nexec-allow = [\"/usr/bin\", \"/bin\"]\ninsecure_no_auth = true\naudit-retention = \"30d\"\n",
    )
    .unwrap();
    let config = file.display().to_string();
    let printed = |extra: &[&str], env: &[(&str, &str)]| {
        let out = flotilla()
            .args(["serve", "--config", &config, "--print-config"])
            .args(extra)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        toml_of(&String::from_utf8_lossy(&out.stdout))
    };
    let from_file = printed(&[], &[]);
    assert_eq!(from_file["listen"].as_str(), Some("127.0.0.1:9001"));
    assert_eq!(from_file["lease-ttl"].as_str(), Some("5"));
    assert_eq!(from_file["audit-retention"].as_str(), Some("30d"));
    assert_eq!(from_file["insecure-no-auth"].as_bool(), Some(true));
    assert_eq!(
        from_file["exec-allow"].as_array().map(Vec::len),
        Some(2),
        "{from_file}"
    );
    // Defaults are printed too: every setting is there.
    assert_eq!(from_file["max-requests"].as_str(), Some("256"));
    // The environment wins over the file, the command line over both.
    let over = printed(
        &["--listen", "127.0.0.1:9003"],
        &[
            ("FLOTILLA_LEASE_TTL", "7"),
            ("FLOTILLA_LISTEN", "127.0.0.1:9002"),
        ],
    );
    assert_eq!(over["lease-ttl"].as_str(), Some("7"));
    assert_eq!(over["listen"].as_str(), Some("127.0.0.1:9003"));
    // What it prints is itself a configuration file that gives the same.
    let again = dir.path().join("printed.toml");
    std::fs::write(&again, toml::to_string(&from_file).unwrap()).unwrap();
    let out = flotilla()
        .args(["serve", "--print-config", "--config"])
        .arg(&again)
        .output()
        .unwrap();
    assert_eq!(
        toml_of(&String::from_utf8_lossy(&out.stdout)),
        from_file,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Refused, each with the file and the key, and a non-zero exit.
    for (text, needle) in [
        ("nope = 1\n", "unknown key \"nope\""),
        ("lease_ttl = [1]\n", "lease_ttl = [1]"),
        ("insecure_no_auth = \"yes\"\n", "must be true or false"),
        ("listen = \n", "not TOML"),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = flotilla()
            .args(["serve", "--config", &config])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {said}");
        assert!(
            said.contains(&config) && said.contains(needle),
            "{text}: {said}"
        );
    }
}

#[test]
fn identity_providers_are_tables_of_the_configuration_file() {
    let dir = TempDir::new("config-oidc");
    let file = dir.path().join("flotilla.toml");
    let config = file.display().to_string();
    std::fs::write(
        &file,
        r#"auth = "oidc-only"

[[identity-provider]]
name = "corp"
issuer = "https://login.example.com/tenant/v2.0"
audience = "api://flotilla"
clientId = "flotilla-dashboard"
groupsClaim = "groups"
roles = [
  { groups = ["platform"], role = "admin" },
  { groups = ["release-managers"], role = "approver", fleets = ["prod-*"] },
]

[[identity-provider]]
name = "github"
issuer = "https://token.actions.githubusercontent.com"
audience = "flotilla"
roles = [{ subjects = ["repo:acme/deploy:ref:refs/heads/main"], role = "operator" }]
"#,
    )
    .unwrap();
    let out = flotilla()
        .args(["serve", "--config", &config, "--print-config"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = toml_of(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(printed["auth"].as_str(), Some("oidc-only"));
    let providers = printed["identity-provider"].as_array().expect("tables");
    assert_eq!(providers.len(), 2, "{printed}");
    assert_eq!(providers[1]["name"].as_str(), Some("github"));
    assert_eq!(
        providers[0]["roles"][1]["fleets"][0].as_str(),
        Some("prod-*"),
        "{printed}"
    );
    // A provider that does not check out stops the server with the field and the value.
    for (text, needle) in [
        (
            "[[identity-provider]]\nname = \"corp\"\nissuer = \"http://idp.example\"\naudience = \"a\"\n",
            "identity-provider[0].issuer: \"http://idp.example\": must be https://",
        ),
        (
            "[[identity-provider]]\nname = \"corp\"\nissuer = \"https://idp.example\"\naudience = \"a\"\nroles = [{ groups = [\"g\"], role = \"root\" }]\n",
            "identity-provider[0].roles[0].role: \"root\"",
        ),
        (
            "[[identity-provider]]\nissuer = \"https://idp.example\"\n",
            "identity-provider[0].name: is required",
        ),
        (
            "auth = \"oidc-only\"\n",
            "no identity provider is configured",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = flotilla()
            .args(["serve", "--listen", "127.0.0.1:0", "--database"])
            .arg(dir.path().join("x.db"))
            .args(["--config", &config])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}: {said}");
        assert!(said.contains(needle), "{text}: {said}");
    }
}

#[test]
fn a_server_from_its_configuration_file_logs_json_and_says_a_clean_shutdown_at_info() {
    let dir = TempDir::new("service");
    let port = free_port();
    let database = dir.path().join("flotilla.db");
    let file = dir.path().join("flotilla.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = \"{}\"\ninsecure-no-auth = true\nlog-format = \"json\"\n",
            database.display()
        ),
    )
    .unwrap();
    let log = dir.path().join("server.log");
    let child = flotilla()
        .args(["serve", "--config"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut server = Killed(child);
    let http = reqwest::blocking::Client::new();
    wait_for("the server", Duration::from_secs(20), || {
        http.get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .is_ok_and(|r| r.status().is_success())
    });
    // A fleet, so that a lease is held and let go at shutdown.
    let made = http
        .put(format!("http://127.0.0.1:{port}/v1/fleets/edge"))
        .json(&serde_json::json!({"properties": {"driver": {"type": "sim"}}}))
        .send()
        .unwrap();
    assert!(made.status().is_success(), "{:?}", made.text());
    wait_for("the fleet's lease", Duration::from_secs(20), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("took the fleet's lease"))
    });
    assert!(
        Command::new("kill")
            .args(["-TERM", &server.0.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let status = server.0.wait().unwrap();
    assert!(status.success(), "a clean shutdown exits 0: {status}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains('\u{1b}'), "no colour in a file: {text}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(!lines.is_empty(), "{text}");
    let at = |message: &str| {
        lines
            .iter()
            .find(|l| {
                l["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(message))
            })
            .map(|l| l["level"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(at("shutting down").as_deref(), Some("INFO"), "{text}");
    assert_eq!(
        at("let the fleet's runs go at shutdown").as_deref(),
        Some("INFO"),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["level"] != "WARN" && l["level"] != "ERROR"),
        "nothing to warn of in a clean run: {text}"
    );
}
