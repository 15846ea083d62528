//! The `flotilla` binary: one command-line entry point for every part of the product.

/// `println!` to standard output, where a reader that closed the pipe (`flotilla … | head -1`)
/// ends the command quietly instead of a panic.
macro_rules! outln {
    () => { $crate::stdout_write(format_args!(""), true) };
    ($($arg:tt)*) => { $crate::stdout_write(format_args!($($arg)*), true) };
}

/// `print!` to standard output, like [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout_write(format_args!($($arg)*), false) };
}

/// The allocator: jemalloc returns what a burst freed and serves the server's threads with
/// less contention than glibc's malloc (BENCHMARKS.md, "The allocator").
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Its options ([`flotilla_server::JEMALLOC_CONF`]), read by jemalloc at its start.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: flotilla_server::CConf =
    flotilla_server::CConf(flotilla_server::JEMALLOC_CONF.as_ptr());

mod client;
mod commands;
mod demo;

/// Writes to standard output; a closed pipe exits 0 at once, any other failure exits 1 with a
/// line on standard error.
pub fn stdout_write(args: std::fmt::Arguments, newline: bool) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(args)
        .and_then(|()| {
            if newline {
                stdout.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| stdout.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("flotilla: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }
}

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

use flotilla_server::Server;
use flotilla_server::auth::{Role, new_token};
use flotilla_server::store::SqliteStore;
use flotilla_server::store::postgres::PgStore;
use flotilla_server::store::prelude::*;
use flotilla_sim::{Scenario, render, simulate};

#[derive(Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Staged, predictable upgrades for fleets of Kubernetes clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// What the commands that talk to a server share (not `serve`, `demo` or `simulate`).
#[derive(clap::Args, Clone)]
struct ClientArgs {
    /// The server to talk to (default: the login file, then http://127.0.0.1:8080).
    #[arg(long, global = true, env = "FLOTILLA_SERVER")]
    server: Option<String>,
    /// The API token (default: the login file).
    #[arg(long, global = true, env = "FLOTILLA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Output format (default: table on a terminal, JSON otherwise).
    #[arg(short = 'o', long, global = true, value_enum, ignore_case = true)]
    output: Option<client::Format>,
    /// A JMESPath query applied to the answer before it is printed, as `az --query`
    /// (example: `--query "[?properties.group=='canary'].name"`).
    #[arg(long, global = true)]
    query: Option<String>,
    /// A certificate authority (PEM) to trust for an `https://` server, besides the system's.
    #[arg(long, global = true, env = "FLOTILLA_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// The resource group, as `az -g`: Fleet Manager's resources are then asked for at their
    /// Azure Resource Manager paths, where a fleet of another resource group is not found.
    #[arg(short = 'g', long, global = true, alias = "resource-group-name")]
    resource_group: Option<String>,
    /// The subscription, with `-g` (default: the server's, `flotilla serve
    /// --arm-subscription`).
    #[arg(long, global = true, requires = "resource_group")]
    subscription: Option<String>,
}

impl ClientArgs {
    fn client(&self) -> anyhow::Result<client::Client> {
        if let Some(query) = self.query.as_deref() {
            client::set_query(query)?;
        }
        let scope = self
            .resource_group
            .clone()
            .map(|group| client::ArmScope::new(group, self.subscription.clone()));
        Ok(client::Client::new(
            self.server.clone(),
            self.token.clone(),
            self.ca_file.as_deref(),
        )?
        .within(scope))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario file in virtual time: a fleet, a catalog, a strategy, actions.
    ///
    /// Example: `flotilla simulate examples/retail-fleet.yaml`.
    Simulate {
        /// The scenario YAML file (format: tests/conformance/FORMAT.md).
        scenario: PathBuf,
        /// Print the result document (run, clusters, events) as JSON.
        #[arg(long, conflicts_with = "check")]
        json: bool,
        /// Compare the result with the scenario's `expect`; exit 1 and say what differs.
        #[arg(long)]
        check: bool,
        /// How to print the result: `table` (default) the timeline and the final tree, `json`
        /// or `yaml` the result document (`--json` is `-o json`).
        #[arg(short = 'o', long, value_enum, ignore_case = true, conflicts_with_all = ["check", "json"])]
        output: Option<client::Format>,
        /// A JMESPath query over the result document, as the client commands' `--query`
        /// (example: `--query run.properties.status.status.state`).
        #[arg(long, conflicts_with = "check")]
        query: Option<String>,
    },
    /// Serve the HTTP API and drive update runs.
    ///
    /// Example: `flotilla serve --database ./flotilla.db` (after `flotilla token create --role
    /// admin --database ./flotilla.db`), or `flotilla serve --insecure-no-auth` to try it out.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080", env = "FLOTILLA_LISTEN")]
        listen: SocketAddr,
        /// Where to store everything: `sqlite://PATH`, `file:PATH` or a file path (default: the
        /// user's data directory; one server per file, whatever names it), or
        /// `postgres://USER@HOST:PORT/DATABASE` (several replicas may share it).
        #[arg(long, env = "FLOTILLA_DATABASE")]
        database: Option<String>,
        /// Serve without authentication (loopback addresses only).
        #[arg(long, env = "FLOTILLA_INSECURE_NO_AUTH")]
        insecure_no_auth: bool,
        /// Seconds a replica's hold on a fleet lasts without renewal: how long a dead replica's
        /// runs wait before another replica takes them over.
        #[arg(long, default_value_t = 10.0, env = "FLOTILLA_LEASE_TTL")]
        lease_ttl: f64,
        /// Bytes of input log a run writes before it is checkpointed (at least its
        /// checkpoint's size): a restart replays at most about this much of each run's log.
        #[arg(
            long,
            default_value_t = flotilla_server::runs::CHECKPOINT_AFTER,
            value_name = "BYTES",
            env = "FLOTILLA_CHECKPOINT_AFTER"
        )]
        checkpoint_after: u64,
        /// How long the audit trail keeps an entry (`400d`, `12h`, `90m`, `30s`, or seconds):
        /// older entries are pruned in the background.
        #[arg(
            long,
            default_value = "400d",
            env = "FLOTILLA_AUDIT_RETENTION",
            value_name = "DURATION"
        )]
        audit_retention: String,
        #[command(flatten)]
        limits: ServeLimits,
        /// A configuration file (TOML): any of these flags as `key = value`, named as the flag
        /// (`listen`, `database`, `lease-ttl` or `lease_ttl`, lists for repeatable flags). A flag
        /// given on the command line wins over its environment variable, which wins over the
        /// file; unknown keys are refused.
        #[arg(long, env = "FLOTILLA_SERVE_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print the configuration `serve` would run with (every setting, from the command
        /// line, the environment, the file or its default) as TOML, and exit.
        #[arg(long)]
        print_config: bool,
        /// How log lines are written to standard error: `plain` (no colour unless it is a
        /// terminal) or `json` (one object per line). Which lines: `FLOTILLA_LOG` (`info` by
        /// default for `serve`; `warn`, `debug`, or per module: `flotilla_server=debug`).
        #[arg(long, value_enum, default_value_t = LogFormat::Plain, env = "FLOTILLA_LOG_FORMAT")]
        log_format: LogFormat,
    },
    /// Fleets and their drivers.
    Fleet {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::FleetCommand,
    },
    /// Member clusters of a fleet.
    Member {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::MemberCommand,
    },
    /// Reusable update strategies.
    Updatestrategy {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::StrategyCommand,
    },
    /// Update runs: create, start, stop, skip, show, watch.
    Updaterun {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::RunCommand,
    },
    /// Approval and scheduled-start gates.
    Gate {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::GateCommand,
    },
    /// Auto-upgrade profiles: runs generated when a channel selects a new release.
    Autoupgradeprofile {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::ProfileCommand,
    },
    /// The audit trail: every accepted write, who made it and when.
    Audit {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::AuditCommand,
    },
    /// Freezes: spans in which no upgrade starts on the members they cover, across every run.
    Freeze {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::FreezeCommand,
    },
    /// Disruption budgets: how many of the members they cover may be in flight at once, across
    /// every run of the fleet, in each region, group or label value.
    Budget {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::BudgetCommand,
    },
    /// Check providers: what health and readiness checks may reach, declared by an admin.
    Checkprovider {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::CheckProviderCommand,
    },
    /// Webhooks: run events POSTed to a URL as CloudEvents, Slack or Teams messages, signed.
    Webhook {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: commands::WebhookCommand,
    },
    /// API tokens.
    Token {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Check a token against a server and remember both for later commands; or, with
    /// `--oidc`, sign in through the identity provider the server names.
    ///
    /// Example: `flotilla login --server https://flotilla.example:8443 --token "$TOKEN"
    /// --ca-file ca.pem`, or `flotilla login --server https://flotilla.example --oidc` (the
    /// device flow: open the page it prints and enter the code; the sign-in renews itself).
    Login {
        #[command(flatten)]
        client: ClientArgs,
        /// Sign in through an identity provider (OpenID Connect device flow) instead of a token.
        #[arg(long, conflicts_with = "token")]
        oidc: bool,
        /// Which of the server's identity providers (with --oidc; needed when it has several).
        #[arg(long, requires = "oidc")]
        provider: Option<String>,
    },
    /// Copy a SQLite database consistently, also while a server is using it.
    ///
    /// Example: `flotilla backup --database ./flotilla.db ./backup-2026-12-01.db`. To restore,
    /// stop the server and serve the copy (`flotilla serve --database ./backup-2026-12-01.db`),
    /// or move it over the original.
    Backup {
        /// The database to copy (default: the user's data directory's).
        #[arg(long, env = "FLOTILLA_DATABASE")]
        database: Option<String>,
        /// Where to write the copy; it must not exist yet.
        copy: PathBuf,
    },
    /// Shell completions: `flotilla completions bash > /etc/bash_completion.d/flotilla`.
    ///
    /// Example: `flotilla completions zsh > ~/.zfunc/_flotilla`.
    Completions {
        /// The shell to write the completion script for.
        #[arg(value_enum, ignore_case = true)]
        shell: clap_complete::Shell,
    },
    /// Start a server with a simulated fleet of 60 clusters and run a staged upgrade on it.
    ///
    /// Example: `flotilla demo --approve-after 60 --exit-when-done`.
    Demo {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Database for the demo (default: a fresh file in a temporary directory).
        #[arg(long)]
        database: Option<String>,
        /// Simulated seconds per real second.
        #[arg(long, default_value_t = 300.0)]
        time_scale: f64,
        /// Approve the production gate by itself after this many seconds (default: wait for you).
        #[arg(long)]
        approve_after: Option<u64>,
        /// Exit when the run ends instead of keeping the server up.
        #[arg(long)]
        exit_when_done: bool,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token; it is printed once and stored hashed. With `--database`, written to the
    /// database directly (to make the first one); otherwise through the server.
    ///
    /// Example: `flotilla token create --role approver --subject alice`.
    Create {
        /// What the token may do: `reader` (read only), `operator` (members, strategies, runs
        /// and their actions), `approver` (an operator that may also approve gates) or `admin`
        /// (everything, also fleets, auto-upgrade profiles and tokens).
        #[arg(long, ignore_case = true, value_parser = commands::choice(&["reader", "operator", "approver", "admin"]))]
        role: String,
        /// Who the token is for (recorded as the approver of gates).
        #[arg(long)]
        subject: Option<String>,
        /// Write the token straight into this database (`sqlite://PATH`, a file path or
        /// `postgres://…`) instead of asking the server: how the first admin token is made.
        #[arg(long)]
        database: Option<String>,
    },
    /// List tokens (never their secrets).
    ///
    /// Example: `flotilla token list -o table`.
    List,
    /// Revoke a token by id.
    ///
    /// Example: `flotilla token revoke 3fa85c0e1b2d` (the id `token list` shows).
    Revoke {
        /// The token's id, as `token list` shows it (not its secret).
        id: String,
    },
}

/// The run's name: the file's stem, made into a valid resource name.
fn run_name(path: &Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("run");
    let name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_matches('-')
        .chars()
        .take(50)
        .collect();
    let name = name.trim_end_matches('-').to_string();
    if name.is_empty() { "run".into() } else { name }
}

fn simulate_command(
    path: &Path,
    output: Option<client::Format>,
    query: Option<&str>,
    check: bool,
) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read scenario {}", path.display()))?;
    let scenario = Scenario::parse(&run_name(path), &text)
        .with_context(|| format!("scenario {}", path.display()))?;
    let result = simulate(&scenario);
    let document = serde_json::to_value(&result)?;
    if check {
        let differences = flotilla_sim::check::check_scenario(&scenario, &document);
        if differences.is_empty() {
            outln!("ok");
            return Ok(ExitCode::SUCCESS);
        }
        for d in differences {
            outln!("{d}");
        }
        return Ok(ExitCode::from(1));
    }
    if let Some(query) = query {
        client::set_query(query)?;
    }
    client::print(output.unwrap_or(client::Format::Table), &document, || {
        render::report(&scenario.description, &result)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// What a `--database` value names.
pub enum Database {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Database {
    pub fn parse(database: Option<&str>) -> anyhow::Result<Database> {
        match database {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Ok(Database::Postgres(url.to_string()))
            }
            other => database_path(other).map(Database::Sqlite),
        }
    }

    /// Opens the store; `serving` takes SQLite's one-server lock.
    pub async fn open(&self, serving: bool) -> anyhow::Result<Arc<dyn Store>> {
        Ok(match self {
            Database::Sqlite(path) if serving => Arc::new(
                SqliteStore::open(path)
                    .await
                    .with_context(|| format!("database {}", path.display()))?,
            ),
            Database::Sqlite(path) => Arc::new(
                SqliteStore::open_unlocked(path)
                    .await
                    .with_context(|| format!("database {}", path.display()))?,
            ),
            Database::Postgres(url) => Arc::new(
                PgStore::open(url)
                    .await
                    .with_context(|| format!("database {self}"))?,
            ),
        })
    }
}

impl std::fmt::Display for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            // The password never reaches a log or a terminal.
            Database::Postgres(url) => match reqwest::Url::parse(url) {
                Ok(mut parsed) if parsed.password().is_some() => {
                    let _ = parsed.set_password(Some("***"));
                    f.write_str(parsed.as_str())
                }
                _ => f.write_str(url),
            },
        }
    }
}

/// The SQLite file a `--database` value names, or the default under the user's data directory.
pub fn database_path(database: Option<&str>) -> anyhow::Result<PathBuf> {
    match database {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            bail!("--database {url}: this command works on a SQLite file only; use sqlite://PATH")
        }
        // One reading of every spelling, the store's: the server's lock and SQLite both get
        // the file it names.
        Some(url) => Ok(flotilla_server::store::sqlite::database_file(url)?),
        None => {
            let base = std::env::var_os("XDG_DATA_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
                .context("cannot find a data directory: set --database, XDG_DATA_HOME or HOME")?;
            Ok(base.join("flotilla").join("flotilla.db"))
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}

// What a client may hold of the server (`flotilla_server::http::Limits`).
#[derive(clap::Args, Debug)]
struct ServeLimits {
    /// Open connections at once; more are closed as soon as they are accepted.
    #[arg(long, default_value_t = 1024, env = "FLOTILLA_MAX_CONNECTIONS")]
    max_connections: usize,
    /// Requests handled at once; more are answered 503.
    #[arg(long, default_value_t = 256, env = "FLOTILLA_MAX_REQUESTS")]
    max_requests: usize,
    /// Seconds a client may take to send a request's headers, and a keep-alive connection may
    /// stay idle.
    #[arg(long, default_value_t = 10.0, env = "FLOTILLA_HEADER_TIMEOUT")]
    header_timeout: f64,
    /// Seconds a client may take to send a request's body.
    #[arg(long, default_value_t = 30.0, env = "FLOTILLA_BODY_TIMEOUT")]
    body_timeout: f64,
    /// The URL users reach the server at (behind a proxy, say); its host name is answered.
    #[arg(long, env = "FLOTILLA_PUBLIC_URL")]
    public_url: Option<String>,
    /// More host names the server answers to, besides IP addresses, `localhost` and the host of
    /// `--public-url` (requests naming another host get 421: DNS rebinding).
    #[arg(long, value_delimiter = ',', env = "FLOTILLA_ALLOWED_HOSTS")]
    allowed_hosts: Vec<String>,
    /// The server's certificate chain (PEM): serve HTTPS instead of HTTP (with --tls-key).
    #[arg(long, env = "FLOTILLA_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "FLOTILLA_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A directory `exec` drivers may run commands from (repeat for more). Without one, fleets
    /// with an `exec` driver are refused: a token that may configure fleets must not be a way
    /// to run any program on the server.
    #[arg(long, env = "FLOTILLA_EXEC_ALLOW")]
    exec_allow: Vec<PathBuf>,
    /// A driver file (JSON, like a fleet's properties.driver) for fleets created without a
    /// driver, as Fleet Manager's clients create them.
    #[arg(long, env = "FLOTILLA_DEFAULT_DRIVER")]
    default_driver: Option<PathBuf>,
    /// The subscription id of fleets created on /v1, in their ARM ids.
    #[arg(
        long,
        default_value = "00000000-0000-0000-0000-000000000000",
        env = "FLOTILLA_ARM_SUBSCRIPTION"
    )]
    arm_subscription: String,
    /// The resource group of fleets created on /v1, in their ARM ids.
    #[arg(long, default_value = "flotilla", env = "FLOTILLA_ARM_RESOURCE_GROUP")]
    arm_resource_group: String,
    /// Which credentials are taken: `any` (API tokens and identity providers' JWTs) or
    /// `oidc-only` (identity providers' JWTs only; API tokens are refused).
    #[arg(long, value_enum, default_value_t = AuthFlag::Any, env = "FLOTILLA_AUTH")]
    auth: AuthFlag,
    /// An OpenID Connect identity provider whose JWTs are taken (repeat for more): a JSON
    /// object with `name` and the fields of docs/oidc.md (`issuer`, `audience`, `clientId`,
    /// `roles`, ...). In the configuration file, `[[identity-provider]]` tables. These are
    /// read-only through the API.
    #[arg(long, value_name = "JSON")]
    identity_provider: Vec<String>,
}

/// `serve --auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum AuthFlag {
    Any,
    OidcOnly,
}

impl ServeLimits {
    /// The identity providers of `--identity-provider`, checked: an error names the provider
    /// and the field.
    fn identity_providers(
        &self,
    ) -> anyhow::Result<Vec<flotilla_server::oidc::config::ProviderConfig>> {
        use flotilla_server::oidc::config::{ProviderConfig, Source};
        let mut providers: Vec<ProviderConfig> = Vec::new();
        for (i, text) in self.identity_provider.iter().enumerate() {
            let at = format!("identity-provider[{i}]");
            let mut value: serde_json::Value = serde_json::from_str(text)
                .with_context(|| format!("--identity-provider {at}: not JSON"))?;
            let Some(map) = value.as_object_mut() else {
                bail!("--identity-provider {at}: must be an object");
            };
            let name = match map.remove("name") {
                Some(serde_json::Value::String(name)) => name,
                Some(other) => bail!("--identity-provider {at}.name: {other}: must be a string"),
                None => bail!("--identity-provider {at}.name: is required"),
            };
            let config = ProviderConfig::parse(&name, Source::File, &value, &format!("{at}."))
                .map_err(|e| anyhow::anyhow!("--identity-provider {e}"))?;
            if providers.iter().any(|p| p.name == config.name) {
                bail!("--identity-provider {at}.name: {name:?} is named twice");
            }
            if providers.iter().any(|p| p.issuer == config.issuer) {
                bail!(
                    "--identity-provider {at}.issuer: {:?} is another provider's issuer",
                    config.issuer
                );
            }
            providers.push(config);
        }
        Ok(providers)
    }
}

impl ServeLimits {
    /// The ARM paths' settings: the default home of fleets and the default driver, checked.
    fn arm(&self) -> anyhow::Result<flotilla_server::home::Settings> {
        for (flag, value) in [
            ("--arm-subscription", &self.arm_subscription),
            ("--arm-resource-group", &self.arm_resource_group),
        ] {
            let ok = !value.is_empty()
                && value.len() <= 90
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.()".contains(c));
            if !ok {
                bail!(
                    "{flag} {value:?}: must be 1 to 90 letters, digits, '-', '_', '.', '(' or ')'"
                );
            }
        }
        let default_driver = match &self.default_driver {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--default-driver {}", path.display()))?;
                let driver: serde_json::Value = serde_json::from_str(&text)
                    .with_context(|| format!("--default-driver {}: not JSON", path.display()))?;
                let allow = flotilla_server::driver::ExecAllow::new(&self.exec_allow)
                    .map_err(|e| anyhow::anyhow!(e))?;
                flotilla_server::driver::validate_driver_config(&driver, &allow).map_err(|e| {
                    anyhow::anyhow!(
                        "--default-driver {}: {}: {}",
                        path.display(),
                        e.field,
                        e.message
                    )
                })?;
                Some(driver)
            }
        };
        Ok(flotilla_server::home::Settings {
            subscription: self.arm_subscription.clone(),
            resource_group: self.arm_resource_group.clone(),
            default_driver,
            https: false,
            public_url: self.public_url.clone(),
            // Both set from the listener when serving starts.
            loopback_listener: false,
        })
    }
}

impl ServeLimits {
    fn parse(&self) -> anyhow::Result<flotilla_server::http::Limits> {
        let seconds = |flag: &str, value: f64| {
            if value.is_finite() && (0.1..=3600.0).contains(&value) {
                Ok(std::time::Duration::from_secs_f64(value))
            } else {
                bail!("{flag} {value}: must be between 0.1 and 3600 seconds")
            }
        };
        let count = |flag: &str, value: usize| {
            if (1..=1_000_000).contains(&value) {
                Ok(value)
            } else {
                bail!("{flag} {value}: must be between 1 and 1000000")
            }
        };
        Ok(flotilla_server::http::Limits {
            max_connections: count("--max-connections", self.max_connections)?,
            max_requests: count("--max-requests", self.max_requests)?,
            header_timeout: seconds("--header-timeout", self.header_timeout)?,
            body_timeout: seconds("--body-timeout", self.body_timeout)?,
        })
    }
}

/// The host names of `--public-url` and `--allowed-hosts`.
fn serve_limits_hosts(flags: &ServeLimits) -> anyhow::Result<Vec<String>> {
    let mut hosts = flags.allowed_hosts.clone();
    if let Some(url) = &flags.public_url {
        let parsed =
            reqwest::Url::parse(url).with_context(|| format!("--public-url {url:?}: not a URL"))?;
        let Some(host) = parsed.host_str() else {
            bail!("--public-url {url:?}: has no host");
        };
        hosts.push(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        );
    }
    Ok(hosts)
}

async fn backup_command(database: Option<&str>, to: &Path) -> anyhow::Result<ExitCode> {
    let from = database_path(database).context(
        "backup copies a SQLite file; for PostgreSQL use pg_dump, which is consistent too",
    )?;
    if to.exists() {
        bail!("{}: already exists; name a new file", to.display());
    }
    if !from.exists() {
        bail!("--database {}: no such database", from.display());
    }
    let store = SqliteStore::open_unlocked(&from)
        .await
        .with_context(|| format!("database {}", from.display()))?;
    store
        .backup_to(to)
        .await
        .with_context(|| format!("cannot write {}", to.display()))?;
    store.close().await;
    eprintln!(
        "flotilla: copied {} to {} (a consistent snapshot; serve it with --database {})",
        from.display(),
        to.display(),
        to.display()
    );
    Ok(ExitCode::SUCCESS)
}

// How `serve` paces its replicas and runs.
struct ServeTiming {
    lease_ttl: f64,
    checkpoint_after: u64,
    audit_retention: String,
}

async fn serve_command(
    listen: SocketAddr,
    database: Option<String>,
    insecure: bool,
    timing: ServeTiming,
    limits: ServeLimits,
) -> anyhow::Result<ExitCode> {
    let ServeTiming {
        lease_ttl,
        checkpoint_after,
        audit_retention,
    } = timing;
    if !(lease_ttl.is_finite() && (0.5..=3600.0).contains(&lease_ttl)) {
        bail!("--lease-ttl {lease_ttl}: must be between 0.5 and 3600 seconds");
    }
    if !(1..=1 << 30).contains(&checkpoint_after) {
        bail!("--checkpoint-after {checkpoint_after}: must be between 1 and 1073741824 bytes");
    }
    let audit_retention = flotilla_engine::time::parse_duration(&audit_retention)
        .filter(|s| (1..=100 * 366 * 86_400).contains(s))
        .map(|s| std::time::Duration::from_secs(s.unsigned_abs()))
        .with_context(|| {
            format!(
                "--audit-retention {audit_retention:?}: must be a duration from 1s to 36600d (400d, 12h, 90m, 30s)"
            )
        })?;
    let limits_flags = limits;
    let limits = limits_flags.parse()?;
    // Subprocesses, database files and connections all need file descriptors.
    let files = flotilla_server::http::raise_file_limit();
    let database = Database::parse(database.as_deref())?;
    let store = database.open(true).await?;
    let identity_providers = limits_flags.identity_providers()?;
    let auth_mode = match limits_flags.auth {
        AuthFlag::Any => flotilla_server::oidc::AuthMode::Any,
        AuthFlag::OidcOnly => flotilla_server::oidc::AuthMode::OidcOnly,
    };
    let stored_providers = flotilla_server::identity_providers::stored(store.as_ref()).await?;
    if auth_mode == flotilla_server::oidc::AuthMode::OidcOnly
        && identity_providers.is_empty()
        && stored_providers.is_empty()
    {
        bail!(
            "--auth oidc-only: no identity provider is configured, so nobody could use this server; add an [[identity-provider]] table to the configuration file (docs/oidc.md)"
        );
    }
    if !insecure
        && identity_providers.is_empty()
        && stored_providers.is_empty()
        && store.list_tokens().await?.iter().all(|t| t.revoked)
    {
        bail!(
            "no API token exists, so nobody could use this server; create one with\n  flotilla token create --role admin --database {database}\nor serve without authentication on loopback with --insecure-no-auth"
        );
    }
    let timing = flotilla_server::Timing {
        lease_ttl: std::time::Duration::from_secs_f64(lease_ttl),
        checkpoint_after,
        audit_retention,
        ..Default::default()
    };
    let mut allowed_hosts = serve_limits_hosts(&limits_flags)?;
    let exec_allow = flotilla_server::driver::ExecAllow::new(&limits_flags.exec_allow)
        .map_err(|e| anyhow::anyhow!(e))?;
    let arm = limits_flags.arm()?;
    let mut server = Server::start_configured(store, listen, insecure, timing, exec_allow).await?;
    if let Ok(mut settings) = server.state.arm.write() {
        *settings = Arc::new(arm);
    }
    server.state.oidc.configure(auth_mode, identity_providers);
    server.state.oidc.set_from_api(stored_providers);
    server.limits = limits;
    server.allowed_hosts = std::mem::take(&mut allowed_hosts);
    if let (Some(cert), Some(key)) = (&limits_flags.tls_cert, &limits_flags.tls_key) {
        server.tls = Some(Arc::new(
            flotilla_server::http::tls_config(cert, key).map_err(anyhow::Error::msg)?,
        ));
    }
    let addr = server.local_addr().unwrap_or(listen);
    eprintln!(
        "flotilla: serving {}://{addr} (database {database}{}; replica {}; open files up to {})",
        if server.tls.is_some() {
            "https"
        } else {
            "http"
        },
        if insecure { ", no authentication" } else { "" },
        server.state.runs.replica.id,
        files.map_or("unknown".to_string(), |n| n.to_string())
    );
    server.serve(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn token_command(
    client: &client::Client,
    output: Option<client::Format>,
    command: TokenCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        TokenCommand::List => {
            commands::server_token(client, output, commands::ServerTokenCommand::List).await
        }
        TokenCommand::Revoke { id } => {
            commands::server_token(client, output, commands::ServerTokenCommand::Revoke { id })
                .await
        }
        TokenCommand::Create {
            role,
            subject,
            database: None,
        } => commands::create_token_on_server(client, &role, subject).await,
        TokenCommand::Create {
            role,
            subject,
            database: Some(database),
        } => {
            let database = Some(database);
            let role = Role::parse(&role).with_context(|| {
                format!("--role {role:?}: must be reader, operator, approver or admin")
            })?;
            let store = Database::parse(database.as_deref())?.open(false).await?;
            let subject = subject.unwrap_or_else(|| {
                std::env::var("USER").unwrap_or_else(|_| role.name().to_string())
            });
            let (secret, record) = new_token(role, &subject).map_err(anyhow::Error::msg)?;
            store.create_token(&record).await?;
            // As a server at a clean shutdown: the write-ahead log is moved into the database
            // file, so the file alone (copied, backed up) holds the token.
            store.close().await;
            outln!("{secret}");
            eprintln!(
                "flotilla: created {} token {} for {subject:?}; it is shown only this once",
                role.name(),
                record.id
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Plain,
    Json,
}

/// The arguments with `serve`'s configuration file laid under them: each key of the file that
/// names a flag given neither on the command line nor in its environment variable becomes that
/// flag. Anything wrong with the file (unreadable, not TOML, a key no flag has, a value of the
/// wrong shape) is an error naming the file and the key.
fn with_config_file(args: Vec<std::ffi::OsString>) -> anyhow::Result<Vec<std::ffi::OsString>> {
    use clap::CommandFactory;
    use clap::parser::ValueSource;
    let command = Cli::command();
    // Whatever does not parse is left for the real parse to report.
    let Ok(matches) = command.clone().try_get_matches_from(&args) else {
        return Ok(args);
    };
    let Some(("serve", given)) = matches.subcommand() else {
        return Ok(args);
    };
    let Some(path) = given.get_one::<PathBuf>("config") else {
        return Ok(args);
    };
    let shown = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("--config {shown}"))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("--config {shown}: not TOML"))?;
    let serve = command
        .find_subcommand("serve")
        .context("the serve command")?;
    let settable: Vec<&clap::Arg> = serve
        .get_arguments()
        .filter(|a| {
            a.get_long()
                .is_some_and(|l| !["config", "print-config", "help"].contains(&l))
        })
        .collect();
    let mut extra: Vec<std::ffi::OsString> = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let Some(arg) = settable
            .iter()
            .find(|a| a.get_long() == Some(long.as_str()))
        else {
            let known: Vec<&str> = settable.iter().filter_map(|a| a.get_long()).collect();
            bail!(
                "--config {shown}: unknown key {key:?}; the keys are the flags of `flotilla serve`: {}",
                known.join(", ")
            );
        };
        if matches!(
            given.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let flag = format!("--{long}");
        let scalar = |v: &toml::Value| -> anyhow::Result<String> {
            Ok(match v {
                // `[[identity-provider]]`: each table is the flag's JSON object.
                toml::Value::Table(t) if long == "identity-provider" => serde_json::to_string(t)?,
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(x) => x.to_string(),
                other => bail!(
                    "--config {shown}: {key} = {other}: must be a string or a number{}",
                    if arg.get_action().takes_values() {
                        ""
                    } else {
                        " (or true/false)"
                    }
                ),
            })
        };
        match (value, arg.get_action().takes_values()) {
            (toml::Value::Boolean(on), false) => {
                if *on {
                    extra.push(flag.into());
                }
            }
            (_, false) => bail!("--config {shown}: {key} = {value}: must be true or false"),
            (toml::Value::Array(items), true)
                if matches!(arg.get_action(), clap::ArgAction::Append) =>
            {
                for item in items {
                    extra.push(flag.clone().into());
                    extra.push(scalar(item)?.into());
                }
            }
            (v, true) => {
                extra.push(flag.into());
                extra.push(scalar(v)?.into());
            }
        }
    }
    let mut args = args;
    args.extend(extra);
    Ok(args)
}

/// The configuration `serve` runs with, as TOML: every setting of `flotilla serve` with the
/// value it has (from the command line, the environment, the file, or its default).
fn print_config(args: &[std::ffi::OsString]) -> anyhow::Result<()> {
    use clap::CommandFactory;
    let command = Cli::command();
    let matches = command.clone().try_get_matches_from(args)?;
    let Some(("serve", given)) = matches.subcommand() else {
        return Ok(());
    };
    let serve = command
        .find_subcommand("serve")
        .context("the serve command")?;
    let mut table = toml::Table::new();
    for arg in serve.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if ["config", "print-config", "help"].contains(&long) {
            continue;
        }
        let id = arg.get_id().as_str();
        if !arg.get_action().takes_values() {
            table.insert(long.to_string(), toml::Value::Boolean(given.get_flag(id)));
            continue;
        }
        let values: Vec<String> = given
            .get_raw(id)
            .into_iter()
            .flatten()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let repeatable = matches!(arg.get_action(), clap::ArgAction::Append);
        if long == "identity-provider" {
            // Printed as the configuration file takes them: `[[identity-provider]]` tables.
            let tables = values
                .iter()
                .map(|v| {
                    serde_json::from_str::<toml::Table>(v)
                        .map(toml::Value::Table)
                        .with_context(|| format!("--identity-provider {v}: not a JSON object"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            table.insert(long.to_string(), toml::Value::Array(tables));
            continue;
        }
        let value = match (values.as_slice(), repeatable) {
            (_, true) => toml::Value::Array(values.into_iter().map(toml::Value::String).collect()),
            ([], false) => continue,
            ([one], false) => toml::Value::String(one.clone()),
            (_, false) => toml::Value::Array(values.into_iter().map(toml::Value::String).collect()),
        };
        table.insert(long.to_string(), value);
    }
    out!("{}", toml::to_string(&table)?);
    Ok(())
}

fn main() -> ExitCode {
    // One TLS implementation for the client, the server and PostgreSQL: rustls on aws-lc.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args = match with_config_file(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("flotilla: {e:#}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(&args);
    if let Command::Serve {
        print_config: true, ..
    } = &cli.command
    {
        return match print_config(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("flotilla: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    let outcome = match cli.command {
        Command::Simulate {
            scenario,
            json,
            check,
            output,
            query,
        } => simulate_command(
            &scenario,
            output.or(json.then_some(client::Format::Json)),
            query.as_deref(),
            check,
        ),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "flotilla", &mut script);
            out!("{}", String::from_utf8_lossy(&script));
            Ok(ExitCode::SUCCESS)
        }
        command => {
            // A server says what it does (serving, leases taken, a clean shutdown) at INFO; the
            // other commands only what goes wrong. Colour only on a terminal.
            let (format, default_level) = match &command {
                Command::Serve { log_format, .. } => (*log_format, "info"),
                _ => (LogFormat::Plain, "warn"),
            };
            let filter = tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
                .unwrap_or_else(|_| default_level.into());
            let logs = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr);
            match format {
                LogFormat::Json => logs.json().init(),
                LogFormat::Plain => {
                    use std::io::IsTerminal;
                    logs.with_ansi(std::io::stderr().is_terminal()).init()
                }
            }
            match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(async move {
                    match command {
                        Command::Serve {
                            listen,
                            database,
                            insecure_no_auth,
                            lease_ttl,
                            checkpoint_after,
                            audit_retention,
                            limits,
                            ..
                        } => {
                            let timing = ServeTiming {
                                lease_ttl,
                                checkpoint_after,
                                audit_retention,
                            };
                            serve_command(listen, database, insecure_no_auth, timing, limits).await
                        }
                        Command::Token { client, command } => {
                            let output = client.output;
                            token_command(&client.client()?, output, command).await
                        }
                        Command::Backup { database, copy } => {
                            backup_command(database.as_deref(), &copy).await
                        }
                        Command::Fleet { client, command } => {
                            commands::fleet(&client.client()?, client.output, command).await
                        }
                        Command::Member { client, command } => {
                            commands::member(&client.client()?, client.output, command).await
                        }
                        Command::Updatestrategy { client, command } => {
                            commands::strategy(&client.client()?, client.output, command).await
                        }
                        Command::Updaterun { client, command } => {
                            commands::run(&client.client()?, client.output, command).await
                        }
                        Command::Gate { client, command } => {
                            commands::gate(&client.client()?, client.output, command).await
                        }
                        Command::Audit { client, command } => {
                            commands::audit(&client.client()?, client.output, command).await
                        }
                        Command::Freeze { client, command } => {
                            commands::freeze(&client.client()?, client.output, command).await
                        }
                        Command::Budget { client, command } => {
                            commands::budget(&client.client()?, client.output, command).await
                        }
                        Command::Checkprovider { client, command } => {
                            commands::check_provider(&client.client()?, client.output, command)
                                .await
                        }
                        Command::Webhook { client, command } => {
                            commands::webhook(&client.client()?, client.output, command).await
                        }
                        Command::Autoupgradeprofile { client, command } => {
                            commands::profile(&client.client()?, client.output, command).await
                        }
                        Command::Login {
                            client: args,
                            oidc: true,
                            provider,
                        } => {
                            let server = args.client()?.server;
                            commands::login_oidc(server, provider, args.ca_file.as_deref()).await
                        }
                        Command::Login { client: args, .. } => match args.token.clone() {
                            Some(token) => {
                                let server = args.client()?.server;
                                commands::login(server, token, args.ca_file.as_deref()).await
                            }
                            None => Err(anyhow::anyhow!(
                                "login needs --token (or FLOTILLA_TOKEN) and --server"
                            )),
                        },
                        Command::Demo {
                            listen,
                            database,
                            time_scale,
                            approve_after,
                            exit_when_done,
                        } => {
                            demo::run(listen, database, time_scale, approve_after, exit_when_done)
                                .await
                        }
                        Command::Simulate { .. } | Command::Completions { .. } => {
                            unreachable!("handled above")
                        }
                    }
                }),
                Err(e) => Err(e.into()),
            }
        }
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flotilla: {e:#}");
            // As `az`: 3 when what the command names does not exist, 2 for any other error.
            ExitCode::from(if commands::is_not_found(&e) { 3 } else { 2 })
        }
    }
}

#[cfg(test)]
mod help_tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every command and every flag says what it is for, and every command that does something
    /// shows an example (First hour: "help describes every command and flag with an example").
    #[test]
    fn every_command_and_flag_is_described_with_an_example() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let name = format!("{path} {}", command.get_name()).trim().to_string();
            if command.get_about().is_none() && !path.is_empty() {
                missing.push(format!("{name}: no description"));
            }
            let leaf = command.get_subcommands().next().is_none();
            let example = command
                .get_long_about()
                .or(command.get_about())
                .is_some_and(|a| a.to_string().contains("Example"));
            if leaf && !example && command.get_name() != "help" {
                missing.push(format!("{name}: no example"));
            }
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{name} {id}: no description"));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_name() != "help" {
                    walk(sub, &name, missing);
                }
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
