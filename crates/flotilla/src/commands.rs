//! Client commands that mirror `az fleet`: fleets, members, update strategies, update runs,
//! gates, tokens and login, against a Flotilla server.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use flotilla_engine::status::UpdateRunStatus;
use flotilla_engine::time::Time;

use crate::client::{
    Client, Format, colour_enabled, default_format, print, state, table, write_config,
};

#[derive(Args, Clone)]
pub struct Target {
    /// The fleet.
    #[arg(short = 'f', long = "fleet", alias = "fleet-name")]
    pub fleet: String,
    /// The resource's name.
    #[arg(
        short = 'n',
        long = "name",
        aliases = ["gate-name", "profile-name", "auto-upgrade-profile-name", "update-run-name", "strategy-name", "member-name"]
    )]
    pub name: String,
    #[command(flatten)]
    pub az: AzScope,
}

#[derive(Args, Clone)]
pub struct FleetOnly {
    /// The fleet.
    #[arg(short = 'f', long = "fleet", alias = "fleet-name")]
    pub fleet: String,
    #[command(flatten)]
    pub az: AzScope,
}

// The flags every `az fleet` command takes that change nothing here, accepted so that a script
// written for `az` runs with a rename: a command never asks for confirmation and never waits
// unless it is `wait` or `watch`. (`-g` and `--subscription` are the client's: `ClientArgs`.)
#[derive(Args, Clone, Default)]
#[allow(dead_code)] // read by no command: see above
pub struct AzScope {
    /// Do not ask for confirmation (az's `--yes`; Flotilla never asks).
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// Do not wait for the operation to finish (az's `--no-wait`; Flotilla's writes answer at
    /// once, and the run's progress is in its status).
    #[arg(long)]
    pub no_wait: bool,
}

// `az … wait`: poll a resource until a condition holds.
#[derive(Args, Clone)]
pub struct WaitFor {
    /// Wait until it exists with provisioningState 'Succeeded'.
    #[arg(long)]
    pub created: bool,
    /// Wait until it has been updated, with provisioningState 'Succeeded'.
    #[arg(long)]
    pub updated: bool,
    /// Wait until it is gone.
    #[arg(long)]
    pub deleted: bool,
    /// Wait until it exists.
    #[arg(long)]
    pub exists: bool,
    /// Wait until a JMESPath condition over it (as `-o json` prints it) holds, e.g.
    /// `--custom "labels.ring=='0'"`.
    #[arg(long)]
    pub custom: Option<String>,
    /// Seconds between two looks.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub interval: u64,
    /// Give up after this many seconds (exit 1).
    #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
    pub timeout: u64,
}

impl WaitFor {
    fn any(&self) -> bool {
        self.created || self.updated || self.deleted || self.exists || self.custom.is_some()
    }
}

/// Polls `path` until `wait`'s condition holds: exit 0 then, 1 after `--timeout`, 2 on an error
/// other than the resource being absent. A `--custom` condition that does not hold on a
/// resource that has `ended` (an update run over) cannot come to hold: exit 1 at once.
async fn wait_for(
    client: &Client,
    path: &str,
    what: &str,
    wait: &WaitFor,
    ended: fn(&Value) -> Option<String>,
) -> anyhow::Result<ExitCode> {
    let conditions = [
        wait.created,
        wait.updated,
        wait.deleted,
        wait.exists,
        wait.custom.is_some(),
    ];
    if conditions.iter().filter(|c| **c).count() != 1 {
        bail!("wait needs exactly one of --created, --updated, --deleted, --exists, --custom");
    }
    if let Some(custom) = &wait.custom {
        crate::client::query_holds(custom, &Value::Null)?;
    }
    let deadline = Instant::now() + Duration::from_secs(wait.timeout);
    let interval = Duration::from_secs(wait.interval.max(1));
    loop {
        let found = match client.get(path).await {
            Ok(v) => Some(v),
            Err(e) if is_not_found(&e) => None,
            Err(e) => return Err(e),
        };
        let holds = match (&found, wait) {
            (None, w) => w.deleted,
            (Some(_), w) if w.exists => true,
            (Some(v), w) if w.created || w.updated => {
                s(v, &["properties", "provisioningState"]) == "Succeeded"
            }
            (
                Some(v),
                WaitFor {
                    custom: Some(custom),
                    ..
                },
            ) => crate::client::query_holds(custom, &crate::client::az_shape(v))?,
            (Some(_), _) => false,
        };
        if holds {
            return Ok(ExitCode::SUCCESS);
        }
        if let (Some(v), Some(custom)) = (&found, &wait.custom)
            && let Some(how) = ended(v)
        {
            eprintln!(
                "flotilla: {what} {how} and changes no more by itself; --custom {custom:?} does not hold"
            );
            return Ok(ExitCode::from(1));
        }
        let now = Instant::now();
        if now >= deadline {
            eprintln!(
                "flotilla: {what}: the wait timed out after {}s",
                wait.timeout
            );
            return Ok(ExitCode::from(1));
        }
        tokio::time::sleep(interval.min(deadline - now)).await;
    }
}

/// What a resource other than an update run is: never over, a condition on it may hold later.
fn never_ends(_: &Value) -> Option<String> {
    None
}

/// How an update run ended (`ended Completed`), if it has: nothing about it changes by itself
/// any more.
fn run_ended(run: &Value) -> Option<String> {
    finished(run).then(|| {
        format!(
            "ended {}",
            s(run, &["properties", "status", "status", "state"])
        )
    })
}

/// Whether a command failed because what it names does not exist (404).
pub fn is_not_found(e: &anyhow::Error) -> bool {
    e.chain()
        .find_map(|c| c.downcast_ref::<crate::client::HttpFailure>())
        .is_some_and(|f| f.status == 404)
}

#[derive(Subcommand)]
pub enum FleetCommand {
    /// Create or replace a fleet; `--driver` is a file or inline JSON (`{"type": "sim", ...}`).
    ///
    /// Example: `flotilla fleet create -n retail --driver examples/sim/driver.json`.
    Create {
        /// The fleet's name: lowercase letters, digits and '-', up to 63 characters.
        #[arg(short = 'n', long)]
        name: String,
        /// How the fleet's clusters are observed and upgraded: a JSON file or inline JSON whose
        /// `type` is `sim`, `exec` or `aks` (docs/spec/API.md, "Drivers").
        #[arg(long)]
        driver: String,
        #[command(flatten)]
        az: AzScope,
    },
    /// Show a fleet and its driver.
    ///
    /// Example: `flotilla fleet show -n retail`.
    Show {
        /// The fleet's name.
        #[arg(short = 'n', long)]
        name: String,
        #[command(flatten)]
        az: AzScope,
    },
    /// List the fleets.
    ///
    /// Example: `flotilla fleet list -o table`.
    List {
        #[command(flatten)]
        az: AzScope,
    },
    /// Delete a fleet (refused while one of its update runs is active).
    ///
    /// Example: `flotilla fleet delete -n retail`.
    Delete {
        /// The fleet's name.
        #[arg(short = 'n', long)]
        name: String,
        #[command(flatten)]
        az: AzScope,
    },
    /// Wait until the fleet is created, updated, deleted or a condition holds.
    ///
    /// Example: `flotilla fleet wait -n retail --created --timeout 60`.
    Wait {
        /// The fleet's name.
        #[arg(short = 'n', long)]
        name: String,
        #[command(flatten)]
        wait: WaitFor,
        #[command(flatten)]
        az: AzScope,
    },
}

#[derive(Subcommand)]
pub enum MemberCommand {
    /// Add a cluster to a fleet.
    ///
    /// Example: `flotilla member create -f retail -n canary --cluster-resource-id aks-canary
    /// --update-group canary --labels ring=0`.
    Create {
        #[command(flatten)]
        target: Target,
        /// What the fleet's driver calls the cluster: the managed cluster's ARM id with the
        /// `aks` driver, a key of the driver's `clusters` with `sim` (az's `--member-cluster-id`).
        #[arg(long, alias = "member-cluster-id")]
        cluster_resource_id: String,
        /// The update group the member belongs to; a strategy's stages name groups.
        #[arg(long)]
        update_group: Option<String>,
        /// Labels as space-separated key=value pairs.
        #[arg(long, alias = "member-labels", num_args = 1..)]
        labels: Vec<String>,
    },
    /// Change a member's update group or labels.
    ///
    /// Example: `flotilla member update -f retail -n canary --update-group canary --labels ring=0
    /// env=prod`.
    Update {
        #[command(flatten)]
        target: Target,
        /// The update group to move the member to.
        #[arg(long)]
        update_group: Option<String>,
        /// The member's new labels as space-separated key=value pairs; they replace all of its
        /// labels.
        #[arg(long, alias = "member-labels", num_args = 1..)]
        labels: Option<Vec<String>>,
    },
    /// Show a member: its cluster, update group, labels and what was last observed of it.
    ///
    /// Example: `flotilla member show -f retail -n canary`.
    Show {
        #[command(flatten)]
        target: Target,
    },
    /// List a fleet's members.
    ///
    /// Example: `flotilla member list -f retail -o table`.
    List {
        #[command(flatten)]
        fleet: FleetOnly,
    },
    /// Remove a member from a fleet (its cluster is not touched).
    ///
    /// Example: `flotilla member delete -f retail -n canary`.
    Delete {
        #[command(flatten)]
        target: Target,
    },
    /// Register many members at once, 10,000 per request, each request all or nothing.
    ///
    /// FILE is JSON (an array of `{"name", "properties": {...}}`, or `{"value": [...]}`), JSON
    /// lines (one member a line), or CSV with the header `name,clusterResourceId,group,labels`
    /// and labels as `k=v;k2=v2`. Example: `flotilla member import -f retail examples/stores.csv`.
    Import {
        #[command(flatten)]
        fleet: FleetOnly,
        /// The members' file (`-` for standard input).
        file: String,
        /// Replace members that exist (their cluster id cannot change) instead of refusing them.
        #[arg(long)]
        upsert: bool,
    },
    /// Wait until the member is created, updated, deleted or a condition holds.
    ///
    /// Example: `flotilla member wait -f retail -n canary --created --interval 5`.
    Wait {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: WaitFor,
    },
    /// Observe the member's cluster again now, as `az fleet member reconcile` (the member is
    /// written back unchanged).
    ///
    /// Example: `flotilla member reconcile -f retail -n canary`.
    Reconcile {
        #[command(flatten)]
        target: Target,
    },
    /// Register the clusters the fleet's driver finds (an `aks` driver's `discover`): new ones
    /// are added, changed tags update labels and groups, a cluster no longer found is reported
    /// in its member's status and never removed.
    ///
    /// Example: `flotilla member discover -f retail`.
    Discover {
        #[command(flatten)]
        fleet: FleetOnly,
    },
}

#[derive(Subcommand)]
pub enum StrategyCommand {
    /// Create or replace an update strategy; `--stages` is a file or inline JSON.
    ///
    /// Example: `flotilla updatestrategy create -f retail -n safe-rollout --stages
    /// examples/fleet-stages.json`.
    Create {
        #[command(flatten)]
        target: Target,
        /// The stages: a JSON file or inline JSON, `{"stages": [...]}`, each stage with its
        /// groups, `maxConcurrency`, `maxAllowedFailures` and `afterStageWaitInSeconds`.
        #[arg(long)]
        stages: String,
    },
    /// Show an update strategy: its stages and their groups.
    ///
    /// Example: `flotilla updatestrategy show -f retail -n safe-rollout`.
    Show {
        #[command(flatten)]
        target: Target,
    },
    /// List a fleet's update strategies.
    ///
    /// Example: `flotilla updatestrategy list -f retail`.
    List {
        #[command(flatten)]
        fleet: FleetOnly,
    },
    /// Delete an update strategy (runs created from it keep their copy of its stages).
    ///
    /// Example: `flotilla updatestrategy delete -f retail -n safe-rollout`.
    Delete {
        #[command(flatten)]
        target: Target,
    },
    /// Wait until the strategy is created, updated, deleted or a condition holds.
    ///
    /// Example: `flotilla updatestrategy wait -f retail -n safe-rollout --deleted`.
    Wait {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: WaitFor,
    },
}

#[derive(Subcommand)]
pub enum RunCommand {
    /// Create an update run (it does not start until `updaterun start`).
    ///
    /// Example: `flotilla updaterun create -f retail -n upgrade-131 --upgrade-type Full
    /// --kubernetes-version 1.31.1 --update-strategy-name safe-rollout`.
    Create {
        #[command(flatten)]
        target: Target,
        /// What to upgrade: `Full` (control plane, node pools and node images),
        /// `ControlPlaneOnly`, or `NodeImageOnly` (node images only).
        #[arg(long, ignore_case = true, value_parser = choice(&["Full", "ControlPlaneOnly", "NodeImageOnly"]))]
        upgrade_type: String,
        /// The Kubernetes version to upgrade to, `major.minor.patch` (required for Full and
        /// ControlPlaneOnly, not allowed for NodeImageOnly).
        #[arg(long)]
        kubernetes_version: Option<String>,
        /// How node image versions are chosen: `Latest` (default; the newest in each member's
        /// region when it is upgraded), `Consistent` (the newest available in every region of
        /// the run), or `Custom` (the versions of `--custom-node-image-versions`).
        #[arg(long, ignore_case = true, value_parser = choice(&["Latest", "Consistent", "Custom"]))]
        node_image_selection: Option<String>,
        /// With Custom: `<family>-<version>` values.
        #[arg(long, num_args = 1..)]
        custom_node_image_versions: Vec<String>,
        /// The run's stages, instead of a strategy's: a JSON file or inline JSON, as
        /// `updatestrategy create --stages` takes.
        #[arg(long)]
        stages: Option<String>,
        /// The name of the fleet's update strategy whose stages the run copies. With neither
        /// this nor `--stages`, every member is upgraded one at a time in one stage.
        #[arg(long)]
        update_strategy_name: Option<String>,
        /// Bring members more than one minor behind up one minor at a time, a hop per minor,
        /// within one slot (Full and ControlPlaneOnly).
        #[arg(long)]
        chain_minor_versions: bool,
    },
    /// Start an update run, or resume a stopped one, or retry a failed one.
    ///
    /// Example: `flotilla updaterun start -f retail -n upgrade-131`.
    Start {
        #[command(flatten)]
        target: Target,
    },
    /// Stop an update run: no new member starts; upgrades already sent to clusters finish.
    ///
    /// Example: `flotilla updaterun stop -f retail -n upgrade-131`.
    Stop {
        #[command(flatten)]
        target: Target,
    },
    /// Roll a finished or stopped run back (SEMANTICS §15): makes and starts its rollback run,
    /// which takes every member the run changed back to where it was, in reverse stage order,
    /// behind one Approval gate; asked again, answers the same rollback run. Approvers only.
    ///
    /// Example: `flotilla updaterun rollback -f retail -n upgrade-131`.
    Rollback {
        #[command(flatten)]
        target: Target,
    },
    /// Skip members, groups, stages or waits: `--targets Type:Name ...`.
    ///
    /// Example: `flotilla updaterun skip -f retail -n upgrade-131 --targets Member:canary
    /// AfterStageWait:canary-stage`.
    Skip {
        #[command(flatten)]
        target: Target,
        /// Space-separated targets to skip, each `Type:Name` with Type (in any case) one of
        /// `Member`, `Group`, `Stage` or `AfterStageWait` (a wait is named by its stage).
        #[arg(long, num_args = 1.., required = true)]
        targets: Vec<String>,
    },
    /// The run with its stage → group → member tree.
    ///
    /// Example: `flotilla updaterun show -f retail -n upgrade-131`.
    Show {
        #[command(flatten)]
        target: Target,
    },
    /// List a fleet's update runs with their state and target.
    ///
    /// Example: `flotilla updaterun list -f retail -o table`.
    List {
        #[command(flatten)]
        fleet: FleetOnly,
    },
    /// Delete an update run (not while it is running).
    ///
    /// Example: `flotilla updaterun delete -f retail -n upgrade-131`.
    Delete {
        #[command(flatten)]
        target: Target,
    },
    /// Wait until the run ends; the exit code tells how it ended (0 completed, 6 completed with
    /// tolerated failures, 4 failed, 5 stopped, 1 not ended by `--timeout`). With `--created`,
    /// `--updated`, `--deleted`, `--exists` or `--custom`, wait for that instead, as `az`; a
    /// `--custom` condition that does not hold on a run that has ended exits 1 at once.
    ///
    /// Example: `flotilla updaterun wait -f retail -n upgrade-131 --timeout 7200`.
    Wait {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: WaitFor,
    },
    /// Follow the run live with a progress bar per stage; exits with the run's outcome.
    ///
    /// Example: `flotilla updaterun watch -f retail -n upgrade-131`.
    Watch {
        #[command(flatten)]
        target: Target,
    },
    /// Forecast when each stage, group and member will be upgraded and when the run ends
    /// (nothing is touched). Example: `flotilla updaterun forecast -f edge -n r1
    /// --approval-delay 3600`.
    Forecast {
        #[command(flatten)]
        target: Target,
        /// Seconds after it is reached that an Approval gate is taken to be approved.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        approval_delay: Option<i64>,
        /// The duration of an upgrade with no history or driver estimate, in seconds.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        default_duration: Option<i64>,
        /// Also forecast the run as it would go with other stages or another target, and
        /// compare (`--what-if --stages FILE`, `--what-if --kubernetes-version 1.32.0`).
        #[arg(long)]
        what_if: bool,
        /// With --what-if: the stages to compare (a file or JSON, as `updaterun create`).
        #[arg(long, requires = "what_if")]
        stages: Option<String>,
        /// With --what-if: the Kubernetes version to compare.
        #[arg(long, requires = "what_if")]
        kubernetes_version: Option<String>,
    },
    /// Create a new run from a finished one's strategy snapshot and upgrade.
    ///
    /// Example: `flotilla updaterun rerun -f retail -n upgrade-131 --new-name upgrade-131-retry`.
    Rerun {
        #[command(flatten)]
        target: Target,
        /// The new run's name.
        #[arg(long)]
        new_name: String,
    },
}

#[derive(Subcommand)]
pub enum GateCommand {
    /// List a fleet's gates, with their run, stage, group and state: those its runs have
    /// reached (a gate appears, Pending, when its run reaches it).
    ///
    /// Example: `flotilla gate list -f retail --run upgrade-131 --stage prod --state Pending`.
    List {
        #[command(flatten)]
        fleet: FleetOnly,
        /// Only the gates of this update run (which must exist).
        #[arg(long, alias = "update-run-name")]
        run: Option<String>,
        /// Only the gates of this stage (with --run, a stage of that run), its groups' included.
        #[arg(long)]
        stage: Option<String>,
        /// Only gates in this state (az's `--state-filter`).
        #[arg(long, alias = "state-filter", ignore_case = true, value_parser = choice(&["Pending", "Completed", "Skipped", "Failed"]))]
        state: Option<String>,
        /// Only gates of this type.
        #[arg(long, ignore_case = true, value_parser = choice(&["Approval", "ScheduledStart", "HealthCheck"]))]
        gate_type: Option<String>,
    },
    /// Show a gate.
    ///
    /// Example: `flotilla gate show -f retail -n 3f2c…` (the id `gate list` shows).
    Show {
        #[command(flatten)]
        target: Target,
    },
    /// Approve a pending gate.
    ///
    /// Example: `flotilla gate approve -f retail -n 3f2c…` (the id `gate list` shows).
    Approve {
        #[command(flatten)]
        target: Target,
    },
    /// Change a gate's state, as `az fleet gate update`: `--state Completed` approves it.
    ///
    /// Example: `flotilla gate update -f retail --gate-name 3f2c… --state Completed`.
    Update {
        #[command(flatten)]
        target: Target,
        /// The new state; a gate can only be completed.
        #[arg(long, ignore_case = true, value_parser = choice(&["Completed"]))]
        state: String,
    },
}

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Every accepted write, oldest first: when, who (subject and role), what (method and
    /// path) and the answer's status.
    ///
    /// Example: `flotilla audit list -f retail -o table`.
    List {
        /// Only the writes to this fleet and what is in it.
        #[arg(short = 'f', long = "fleet", alias = "fleet-name")]
        fleet: Option<String>,
    },
}

/// `flotilla audit …`.
pub async fn audit(
    client: &Client,
    format: Option<Format>,
    command: AuditCommand,
) -> anyhow::Result<ExitCode> {
    let format = default_format(format);
    match command {
        AuditCommand::List { fleet } => {
            let path = match fleet {
                Some(f) => format!("/v1/audit?fleet={f}&$top=1000"),
                None => "/v1/audit?$top=1000".to_string(),
            };
            let items = client.list_all(&path).await?;
            let columns: &[(&str, &[&str])] = &[
                ("time", &["time"]),
                ("subject", &["subject"]),
                ("role", &["role"]),
                ("method", &["method"]),
                ("path", &["path"]),
                ("status", &["status"]),
            ];
            print(format, &Value::Array(items.clone()), || {
                resource_rows(&items, columns, false)
            })?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Subcommand)]
pub enum WebhookCommand {
    /// Create or replace a webhook: run events POSTed to a URL, signed with its secret
    /// (replacing one without a secret flag keeps its secret).
    ///
    /// Example: `flotilla webhook create -n ops --url https://hooks.example/flotilla
    /// --secret-env HOOK_SECRET --fleets retail --events RunCompleted,RunFailed,GatePending`.
    Create {
        /// The webhook's name: lowercase letters, digits and '-', up to 50 characters.
        #[arg(short = 'n', long)]
        name: String,
        /// Where events are POSTed: an http or https URL (a Slack or Teams incoming webhook's
        /// URL with --format Slack or Teams).
        #[arg(long)]
        url: String,
        #[command(flatten)]
        secret: SecretArgs,
        /// The fleets whose runs' events it gets, comma-separated (default `*`: every fleet).
        #[arg(long, value_delimiter = ',')]
        fleets: Vec<String>,
        /// The event types it gets, comma-separated: RunCompleted, RunFailed, GatePending,
        /// MemberFailed, ... (default `*`: every event).
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
        /// What is sent: CloudEvents 1.0 JSON (the default), or a Slack or Teams message.
        #[arg(long, ignore_case = true, value_parser = choice(&["CloudEvents", "Slack", "Teams"]))]
        format: Option<String>,
    },
    /// Show a webhook (never its secret: `hasSecret` says there is one).
    ///
    /// Example: `flotilla webhook show -n ops`.
    Show {
        /// The webhook's name.
        #[arg(short = 'n', long)]
        name: String,
    },
    /// List the webhooks.
    ///
    /// Example: `flotilla webhook list -o table`.
    List,
    /// Delete a webhook and its deliveries (those not yet sent are never sent).
    ///
    /// Example: `flotilla webhook delete -n ops`.
    Delete {
        /// The webhook's name.
        #[arg(short = 'n', long)]
        name: String,
    },
    /// A webhook's deliveries, oldest first: when, which event, its state, attempts, the
    /// receiver's last status code and error.
    ///
    /// Example: `flotilla webhook deliveries -n ops --state Pending -o table`.
    Deliveries {
        /// The webhook's name.
        #[arg(short = 'n', long)]
        name: String,
        /// Only deliveries in this state.
        #[arg(long, ignore_case = true, value_parser = choice(&["Pending", "Delivered", "Abandoned"]))]
        state: Option<String>,
    },
}

// Where a webhook's secret comes from: at most one of the three, so it stays out of shell
// history and the process list unless given inline.
#[derive(Args, Clone)]
#[group(multiple = false)]
pub struct SecretArgs {
    /// The secret deliveries are signed with, inline (prefer --secret-file or --secret-env:
    /// an argument is visible to other users of the machine).
    #[arg(long)]
    secret: Option<String>,
    /// A file holding the secret (a trailing newline is dropped).
    #[arg(long)]
    secret_file: Option<std::path::PathBuf>,
    /// The environment variable holding the secret.
    #[arg(long)]
    secret_env: Option<String>,
}

impl SecretArgs {
    /// The secret given, if any.
    fn read(&self) -> anyhow::Result<Option<String>> {
        if let Some(secret) = &self.secret {
            return Ok(Some(secret.clone()));
        }
        if let Some(path) = &self.secret_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--secret-file {}: cannot read it", path.display()))?;
            return Ok(Some(text.trim_end_matches(['\r', '\n']).to_string()));
        }
        if let Some(name) = &self.secret_env {
            let value = std::env::var(name)
                .with_context(|| format!("--secret-env {name}: the variable is not set"))?;
            return Ok(Some(value));
        }
        Ok(None)
    }
}

const WEBHOOK_COLUMNS: &[(&str, &[&str])] = &[
    ("name", &["name"]),
    ("format", &["properties", "format"]),
    ("url", &["properties", "url"]),
    ("fleets", &["properties", "fleets"]),
    ("events", &["properties", "events"]),
];

/// What the commands of a simple resource share: create or replace it, show it, list them,
/// delete it, each printed with the resource's columns.
struct Crud<'a> {
    client: &'a Client,
    format: Format,
    colour: bool,
    columns: &'a [(&'a str, &'a [&'a str])],
    /// What a table adds below one resource's row (a budget's partitions); nothing by default.
    detail: fn(&Value) -> String,
}

impl Crud<'_> {
    fn new<'a>(
        client: &'a Client,
        format: Option<Format>,
        columns: &'a [(&'a str, &'a [&'a str])],
    ) -> Crud<'a> {
        Crud {
            client,
            format: default_format(format),
            colour: colour_enabled(),
            columns,
            detail: |_| String::new(),
        }
    }

    /// One resource as a table: its row, then its detail.
    fn one(&self, v: &Value) -> String {
        one_row(v, self.columns, self.colour) + &(self.detail)(v)
    }

    async fn put(&self, path: &str, properties: Value) -> anyhow::Result<()> {
        let v = self
            .client
            .send(
                reqwest::Method::PUT,
                path,
                Some(&json!({"properties": properties})),
            )
            .await?;
        print(self.format, &v, || self.one(&v))
    }

    async fn show(&self, path: &str) -> anyhow::Result<()> {
        let v = self.client.get(path).await?;
        print(self.format, &v, || self.one(&v))
    }

    async fn list(&self, path: &str) -> anyhow::Result<()> {
        let items = self.client.list_all(path).await?;
        print(self.format, &Value::Array(items.clone()), || {
            resource_rows(&items, self.columns, self.colour)
        })
    }

    async fn delete(&self, path: &str, what: &str) -> anyhow::Result<()> {
        self.client
            .send(reqwest::Method::DELETE, path, None)
            .await?;
        eprintln!("deleted {what}");
        Ok(())
    }
}

/// A fleet's rules, at `/v1/fleets/{fleet}/{collection}/{name}` (freezes, disruption budgets):
/// the simple resource's commands, addressed by fleet and name.
struct FleetRules<'a> {
    crud: Crud<'a>,
    collection: &'a str,
    /// What `delete` says it deleted (`freeze`, `disruption budget`).
    noun: &'a str,
}

impl FleetRules<'_> {
    fn path(&self, target: &Target) -> String {
        format!(
            "/v1/fleets/{}/{}/{}",
            target.fleet, self.collection, target.name
        )
    }

    async fn put(&self, target: &Target, properties: Value) -> anyhow::Result<()> {
        self.crud.put(&self.path(target), properties).await
    }

    async fn show(&self, target: &Target) -> anyhow::Result<()> {
        self.crud.show(&self.path(target)).await
    }

    async fn list(&self, fleet: &FleetOnly) -> anyhow::Result<()> {
        self.crud
            .list(&format!("/v1/fleets/{}/{}", fleet.fleet, self.collection))
            .await
    }

    async fn delete(&self, target: &Target) -> anyhow::Result<()> {
        let what = format!("{} {}", self.noun, target.name);
        self.crud.delete(&self.path(target), &what).await
    }
}

/// A `properties` object of the fields given, those not given left out.
fn given<const N: usize>(fields: [(&str, Option<Value>); N]) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter_map(|(key, value)| Some((key.to_string(), value?)))
            .collect(),
    )
}

/// `--per-value-of` as the API spells it: `region`, `group` and the `label:` prefix in any case
/// (a label's key keeps its case: keys are case-sensitive).
fn per_value_of_value(given: &str) -> Value {
    let lower = given.to_ascii_lowercase();
    Value::from(match lower.as_str() {
        "region" | "group" => lower,
        _ if lower.starts_with("label:") => format!("label:{}", &given["label:".len()..]),
        _ => given.to_string(),
    })
}

/// `--events` as the API spells them: each event type in any case (`runcompleted` is
/// `RunCompleted`); what is no event type is passed on for the server to refuse.
fn event_types(given: Vec<String>) -> Vec<String> {
    given
        .into_iter()
        .map(|e| {
            flotilla_engine::status::EventType::ALL
                .iter()
                .map(|t| format!("{t:?}"))
                .find(|t| t.eq_ignore_ascii_case(&e))
                .unwrap_or(e)
        })
        .collect()
}

/// A `--selector` as the API's selector (SEMANTICS §2).
fn by_label(selector: String) -> Value {
    json!({"byLabel": selector})
}

#[derive(Subcommand)]
pub enum FreezeCommand {
    /// Create or replace a freeze (SEMANTICS §12): no upgrade of the kinds its scope names
    /// starts, in any run of the fleet, on the members its selector covers, while it is in
    /// force. One-off with --start and --end, or recurring with --recurrence (a maintenance
    /// window's schedule, JSON file or inline, with durationHours 1-168).
    ///
    /// Examples: `flotilla freeze create -f retail -n peak --start 2026-11-26T00:00:00Z --end
    /// 2026-12-01T00:00:00Z --selector env=prod --reason "retail peak"`; `flotilla freeze create
    /// -f retail -n weekends --recurrence '{"schedule": {"weekly": {"intervalWeeks": 1,
    /// "dayOfWeek": "Friday"}}, "startTime": "18:00", "utcOffset": "+01:00", "durationHours": 60}'`.
    Create {
        #[command(flatten)]
        target: Target,
        /// When it begins (RFC 3339).
        #[arg(long)]
        start: Option<String>,
        /// When it ends (RFC 3339), at most 366 days after --start.
        #[arg(long)]
        end: Option<String>,
        /// A recurring freeze's schedule: a JSON file or inline JSON.
        #[arg(long)]
        recurrence: Option<String>,
        /// The members it covers, a label selector (default: every member of the fleet).
        #[arg(long)]
        selector: Option<String>,
        /// What it holds back.
        #[arg(long, ignore_case = true, value_parser = choice(&["AllUpgrades", "MinorUpgrades", "MinorAndNodeUpgrades"]))]
        scope: Option<String>,
        /// Why, shown in the messages of the members it holds.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Show a freeze and its status now: in force or not, its next start and end, the members
    /// it covers.
    ///
    /// Example: `flotilla freeze show -f retail -n peak`.
    Show {
        #[command(flatten)]
        target: Target,
    },
    /// List a fleet's freezes.
    ///
    /// Example: `flotilla freeze list -f retail -o table`.
    List {
        #[command(flatten)]
        fleet: FleetOnly,
    },
    /// Delete a freeze: the members it held may start at the next scheduling pass.
    ///
    /// Example: `flotilla freeze delete -f retail -n peak`.
    Delete {
        #[command(flatten)]
        target: Target,
    },
}

const FREEZE_COLUMNS: &[(&str, &[&str])] = &[
    ("name", &["name"]),
    ("active", &["properties", "status", "active"]),
    ("nextStart", &["properties", "status", "nextStart"]),
    ("nextEnd", &["properties", "status", "nextEnd"]),
    ("scope", &["properties", "scope"]),
    ("reason", &["properties", "reason"]),
];

pub async fn freeze(
    client: &Client,
    format: Option<Format>,
    command: FreezeCommand,
) -> anyhow::Result<ExitCode> {
    let rules = FleetRules {
        crud: Crud::new(client, format, FREEZE_COLUMNS),
        collection: "freezes",
        noun: "freeze",
    };
    match command {
        FreezeCommand::Create {
            target,
            start,
            end,
            recurrence,
            selector,
            scope,
            reason,
        } => {
            let recurrence = recurrence
                .map(|r| file_or_json(&r, "--recurrence"))
                .transpose()?;
            let properties = given([
                ("start", start.map(Value::from)),
                ("end", end.map(Value::from)),
                ("recurrence", recurrence),
                ("selector", selector.map(by_label)),
                ("scope", scope.map(Value::from)),
                ("reason", reason.map(Value::from)),
            ]);
            rules.put(&target, properties).await?;
        }
        FreezeCommand::Show { target } => rules.show(&target).await?,
        FreezeCommand::List { fleet } => rules.list(&fleet).await?,
        FreezeCommand::Delete { target } => rules.delete(&target).await?,
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Subcommand)]
pub enum BudgetCommand {
    /// Create or replace a disruption budget (SEMANTICS §12): at most --max-unavailable of the
    /// members its selector covers are in flight at once, across every run of the fleet, in each
    /// partition of --per-value-of (or in all of them together). A member it holds is Pending,
    /// its message naming the budget and the partition; nothing in flight is interrupted.
    ///
    /// Examples: `flotilla budget create -f retail -n prod-per-region --max-unavailable 1
    /// --per-value-of region --selector env=prod`; `flotilla budget create -f retail -n tenth
    /// --max-unavailable 10% --per-value-of label:tier`.
    Create {
        #[command(flatten)]
        target: Target,
        /// The most members of a partition in flight at once: `N`, or `P%` of the members it
        /// covers in the partition (rounded down, never below 1).
        #[arg(long)]
        max_unavailable: String,
        /// What splits the members into partitions, each held to the budget on its own:
        /// `region`, `group` (the member's group) or `label:KEY` (default: one partition).
        #[arg(long)]
        per_value_of: Option<String>,
        /// The members it covers, a label selector (default: every member of the fleet).
        #[arg(long)]
        selector: Option<String>,
    },
    /// Show a disruption budget and its partitions now: each value, the members it covers
    /// there, the most of them that may be in flight and those in flight.
    ///
    /// Example: `flotilla budget show -f retail -n prod-per-region -o table`.
    Show {
        #[command(flatten)]
        target: Target,
    },
    /// List a fleet's disruption budgets (`show` gives one's partitions).
    ///
    /// Example: `flotilla budget list -f retail -o table`.
    List {
        #[command(flatten)]
        fleet: FleetOnly,
    },
    /// Delete a disruption budget: the members it held may start at the next scheduling pass.
    ///
    /// Example: `flotilla budget delete -f retail -n prod-per-region`.
    Delete {
        #[command(flatten)]
        target: Target,
    },
}

const BUDGET_COLUMNS: &[(&str, &[&str])] = &[
    ("name", &["name"]),
    ("maxUnavailable", &["properties", "maxUnavailable"]),
    ("perValueOf", &["properties", "perValueOf"]),
    ("selector", &["properties", "selector", "byLabel"]),
];

/// A budget's partitions as a table below its row; the value of a budget's one partition is
/// `(all)`, that of the members lacking the value `(none)`.
fn partition_table(budget: &Value) -> String {
    let Some(partitions) = budget["properties"]["status"]["partitions"].as_array() else {
        return String::new();
    };
    let whole = budget["properties"]["perValueOf"].is_null();
    let rows: Vec<Value> = partitions
        .iter()
        .map(|p| {
            let mut row = p.clone();
            if s(p, &["value"]).is_empty() {
                row["value"] = json!(if whole { "(all)" } else { "(none)" });
            }
            row
        })
        .collect();
    let columns: &[(&str, &[&str])] = &[
        ("value", &["value"]),
        ("members", &["members"]),
        ("maxUnavailable", &["maxUnavailable"]),
        ("disrupted", &["disrupted"]),
    ];
    format!("\n{}", resource_rows(&rows, columns, false))
}

pub async fn budget(
    client: &Client,
    format: Option<Format>,
    command: BudgetCommand,
) -> anyhow::Result<ExitCode> {
    let rules = FleetRules {
        crud: Crud {
            detail: partition_table,
            ..Crud::new(client, format, BUDGET_COLUMNS)
        },
        collection: "disruptionBudgets",
        noun: "disruption budget",
    };
    match command {
        BudgetCommand::Create {
            target,
            max_unavailable,
            per_value_of,
            selector,
        } => {
            let properties = given([
                ("maxUnavailable", Some(Value::from(max_unavailable))),
                (
                    "perValueOf",
                    per_value_of.as_deref().map(per_value_of_value),
                ),
                ("selector", selector.map(by_label)),
            ]);
            rules.put(&target, properties).await?;
        }
        BudgetCommand::Show { target } => rules.show(&target).await?,
        BudgetCommand::List { fleet } => rules.list(&fleet).await?,
        BudgetCommand::Delete { target } => rules.delete(&target).await?,
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Subcommand)]
pub enum CheckProviderCommand {
    /// Create or replace a check provider: what health and readiness checks may reach (admin).
    /// Strategies and runs name it and carry only data: a query, a path, arguments.
    ///
    /// Examples: `flotilla checkprovider create -n prom --type Prometheus --endpoint
    /// http://prometheus:9090`; `flotilla checkprovider create -n health --type Http --base-url
    /// https://health.example.com --header Authorization={env:FLOTILLA_CHECK_TOKEN}`;
    /// `flotilla checkprovider create -n probe --type Exec --command /opt/checks/probe
    /// --command --quiet --fleets prod`.
    Create {
        /// The provider's name: lowercase letters, digits and '-', up to 63 characters.
        #[arg(short = 'n', long)]
        name: String,
        /// What it reaches.
        #[arg(long = "type", ignore_case = true, value_parser = choice(&["Prometheus", "Http", "Exec"]))]
        provider_type: String,
        /// A Prometheus server's base URL (type Prometheus).
        #[arg(long)]
        endpoint: Option<String>,
        /// The base URL checks' paths are appended to (type Http).
        #[arg(long)]
        base_url: Option<String>,
        /// The program and its fixed arguments, one word per flag (type Exec; the program must
        /// be under the server's --exec-allow).
        #[arg(long = "command", allow_hyphen_values = true)]
        command: Vec<String>,
        /// Let checks add arguments that start with `-` (type Exec).
        #[arg(long)]
        allow_options: bool,
        /// A header sent with every request, NAME=VALUE; VALUE may be {env:FLOTILLA_CHECK_*}.
        #[arg(long = "header")]
        headers: Vec<String>,
        /// A PEM file of certificate authorities to trust (read by the server when saved).
        #[arg(long)]
        ca_file: Option<String>,
        /// The fleets whose strategies and runs may name it, comma-separated (default: every
        /// fleet).
        #[arg(long, value_delimiter = ',')]
        fleets: Vec<String>,
    },
    /// Show a check provider (literal header values are shown as <redacted>).
    ///
    /// Example: `flotilla checkprovider show -n prom`.
    Show {
        /// The provider's name.
        #[arg(short = 'n', long)]
        name: String,
    },
    /// List the check providers.
    ///
    /// Example: `flotilla checkprovider list -o table`.
    List,
    /// Delete a check provider (refused while a strategy or a run that is not over names it).
    ///
    /// Example: `flotilla checkprovider delete -n prom`.
    Delete {
        /// The provider's name.
        #[arg(short = 'n', long)]
        name: String,
    },
}

const CHECK_PROVIDER_COLUMNS: &[(&str, &[&str])] = &[
    ("name", &["name"]),
    ("type", &["properties", "type"]),
    ("endpoint", &["properties", "endpoint"]),
    ("baseUrl", &["properties", "baseUrl"]),
    ("command", &["properties", "command"]),
    ("fleets", &["properties", "fleets"]),
];

pub async fn check_provider(
    client: &Client,
    format: Option<Format>,
    command: CheckProviderCommand,
) -> anyhow::Result<ExitCode> {
    let crud = Crud::new(client, format, CHECK_PROVIDER_COLUMNS);
    let path = |name: &str| format!("/v1/checkProviders/{name}");
    match command {
        CheckProviderCommand::Create {
            name,
            provider_type,
            endpoint,
            base_url,
            command,
            allow_options,
            headers,
            ca_file,
            fleets,
        } => {
            let mut properties = json!({"type": provider_type});
            if let Some(endpoint) = endpoint {
                properties["endpoint"] = json!(endpoint);
            }
            if let Some(base) = base_url {
                properties["baseUrl"] = json!(base);
            }
            if !command.is_empty() {
                properties["command"] = json!(command);
            }
            if allow_options {
                properties["allowOptions"] = json!(true);
            }
            if !headers.is_empty() {
                let mut map = serde_json::Map::new();
                for h in &headers {
                    let (key, value) = h
                        .split_once('=')
                        .with_context(|| format!("--header {h:?}: must be NAME=VALUE"))?;
                    map.insert(key.to_string(), json!(value));
                }
                properties["headers"] = Value::Object(map);
            }
            if let Some(ca) = ca_file {
                properties["caFile"] = json!(ca);
            }
            if !fleets.is_empty() {
                properties["fleets"] = json!(fleets);
            }
            crud.put(&path(&name), properties).await?;
        }
        CheckProviderCommand::Show { name } => crud.show(&path(&name)).await?,
        CheckProviderCommand::List => crud.list("/v1/checkProviders").await?,
        CheckProviderCommand::Delete { name } => {
            crud.delete(&path(&name), &format!("check provider {name}"))
                .await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `flotilla webhook …`.
pub async fn webhook(
    client: &Client,
    format: Option<Format>,
    command: WebhookCommand,
) -> anyhow::Result<ExitCode> {
    let crud = Crud::new(client, format, WEBHOOK_COLUMNS);
    let (format, colour) = (default_format(format), colour_enabled());
    let path = |name: &str| format!("/v1/webhooks/{name}");
    match command {
        WebhookCommand::Create {
            name,
            url,
            secret,
            fleets,
            events,
            format: shape,
        } => {
            let mut properties = json!({"url": url});
            if let Some(secret) = secret.read()? {
                properties["secret"] = json!(secret);
            }
            if !fleets.is_empty() {
                properties["fleets"] = json!(fleets);
            }
            if !events.is_empty() {
                properties["events"] = json!(event_types(events));
            }
            if let Some(shape) = shape {
                properties["format"] = json!(shape);
            }
            crud.put(&path(&name), properties).await?;
        }
        WebhookCommand::Show { name } => crud.show(&path(&name)).await?,
        WebhookCommand::List => crud.list("/v1/webhooks").await?,
        WebhookCommand::Delete { name } => {
            crud.delete(&path(&name), &format!("webhook {name}"))
                .await?;
        }
        WebhookCommand::Deliveries { name, state } => {
            let mut path = format!("/v1/webhooks/{name}/deliveries?$top=1000");
            if let Some(state) = state {
                path.push_str(&format!("&state={state}"));
            }
            let items = client.list_all(&path).await?;
            let columns: &[(&str, &[&str])] = &[
                ("time", &["time"]),
                ("event", &["eventId"]),
                ("type", &["eventType"]),
                ("state", &["state"]),
                ("attempts", &["attempts"]),
                ("status", &["statusCode"]),
                ("error", &["lastError"]),
            ];
            print(format, &Value::Array(items.clone()), || {
                resource_rows(&items, columns, colour)
            })?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Subcommand)]
pub enum ServerTokenCommand {
    List,
    Revoke { id: String },
}

/// A file path or inline JSON.
fn file_or_json(text: &str, what: &str) -> anyhow::Result<Value> {
    let trimmed = text.trim_start();
    let body = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        text.to_string()
    } else {
        std::fs::read_to_string(text)
            .with_context(|| format!("{what}: cannot read file {text:?}"))?
    };
    serde_json::from_str(&body).with_context(|| format!("{what}: not valid JSON"))
}

/// One of `choices`, matched without regard to case as `az` matches enum values, and passed on
/// in its canonical spelling (`--upgrade-type full` is `Full`).
pub fn choice(
    choices: &'static [&'static str],
) -> impl clap::builder::TypedValueParser<Value = String> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(choices).map(move |given: String| {
        choices
            .iter()
            .find(|c| c.eq_ignore_ascii_case(&given))
            .map_or(given, |c| c.to_string())
    })
}

/// `key=value` pairs; a `key` alone is the label with an empty value, as `az` takes it.
fn labels(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            None if !p.is_empty() => Ok((p.to_string(), String::new())),
            _ => bail!("--labels {p:?}: write labels as key=value (or a key alone)"),
        })
        .collect()
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

fn resource_rows(items: &[Value], columns: &[(&str, &[&str])], colour: bool) -> String {
    let headers: Vec<&str> = columns.iter().map(|c| c.0).collect();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| {
            columns
                .iter()
                .map(|(h, path)| {
                    let mut cur = item;
                    for p in *path {
                        cur = &cur[*p];
                    }
                    let text = match cur {
                        Value::String(t) => t.clone(),
                        Value::Null => String::new(),
                        Value::Object(m) if *h == "labels" => m
                            .iter()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                            .collect::<Vec<_>>()
                            .join(","),
                        other => other.to_string(),
                    };
                    if *h == "state" {
                        state(&text, colour)
                    } else {
                        text
                    }
                })
                .collect()
        })
        .collect();
    table(&headers, &rows)
}

const MEMBER_COLUMNS: &[(&str, &[&str])] = &[
    ("name", &["name"]),
    ("group", &["properties", "group"]),
    ("region", &["properties", "status", "cluster", "region"]),
    (
        "version",
        &["properties", "status", "cluster", "kubernetesVersion"],
    ),
    ("labels", &["properties", "labels"]),
    ("cluster", &["properties", "clusterResourceId"]),
];
const RUN_COLUMNS: &[(&str, &[&str])] = &[
    ("name", &["name"]),
    ("state", &["properties", "status", "status", "state"]),
    ("failures", &["properties", "status", "failureCount"]),
    (
        "type",
        &["properties", "managedClusterUpdate", "upgrade", "type"],
    ),
    (
        "version",
        &[
            "properties",
            "managedClusterUpdate",
            "upgrade",
            "kubernetesVersion",
        ],
    ),
    ("started", &["properties", "status", "status", "startTime"]),
    (
        "completed",
        &["properties", "status", "status", "completedTime"],
    ),
];
const GATE_COLUMNS: &[(&str, &[&str])] = &[
    ("name", &["name"]),
    ("state", &["properties", "state"]),
    ("type", &["properties", "gateType"]),
    (
        "run",
        &["properties", "target", "updateRunProperties", "name"],
    ),
    (
        "stage",
        &["properties", "target", "updateRunProperties", "stage"],
    ),
    (
        "group",
        &["properties", "target", "updateRunProperties", "group"],
    ),
    (
        "timing",
        &["properties", "target", "updateRunProperties", "timing"],
    ),
    ("display name", &["properties", "displayName"]),
    ("approved by", &["properties", "approvedBy"]),
];

fn one_row(item: &Value, columns: &[(&str, &[&str])], colour: bool) -> String {
    resource_rows(std::slice::from_ref(item), columns, colour)
}

pub async fn fleet(
    client: &Client,
    format: Option<Format>,
    command: FleetCommand,
) -> anyhow::Result<ExitCode> {
    let format = default_format(format);
    let colour = colour_enabled();
    let columns: &[(&str, &[&str])] = &[
        ("name", &["name"]),
        ("driver", &["properties", "driver", "type"]),
    ];
    match command {
        FleetCommand::Create { name, driver, .. } => {
            let driver = file_or_json(&driver, "--driver")?;
            let v = client
                .send(
                    reqwest::Method::PUT,
                    &format!("/v1/fleets/{name}"),
                    Some(&json!({"properties": {"driver": driver}})),
                )
                .await?;
            print(format, &v, || one_row(&v, columns, colour))?;
        }
        FleetCommand::Show { name, .. } => {
            let v = client.get(&format!("/v1/fleets/{name}")).await?;
            print(format, &v, || one_row(&v, columns, colour))?;
        }
        FleetCommand::List { .. } => {
            let items = client.list_all("/v1/fleets").await?;
            print(format, &Value::Array(items.clone()), || {
                resource_rows(&items, columns, colour)
            })?;
        }
        FleetCommand::Wait { name, wait, .. } => {
            return wait_for(
                client,
                &format!("/v1/fleets/{name}"),
                &format!("fleet {name}"),
                &wait,
                never_ends,
            )
            .await;
        }
        FleetCommand::Delete { name, .. } => {
            client
                .send(reqwest::Method::DELETE, &format!("/v1/fleets/{name}"), None)
                .await?;
            eprintln!("deleted fleet {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn member(
    client: &Client,
    format: Option<Format>,
    command: MemberCommand,
) -> anyhow::Result<ExitCode> {
    let format = default_format(format);
    let colour = colour_enabled();
    match command {
        MemberCommand::Create {
            target,
            cluster_resource_id,
            update_group,
            labels: pairs,
        } => {
            let mut properties =
                json!({"clusterResourceId": cluster_resource_id, "labels": labels(&pairs)?});
            if let Some(g) = update_group {
                properties["group"] = json!(g);
            }
            let v = client
                .send(
                    reqwest::Method::PUT,
                    &format!("/v1/fleets/{}/members/{}", target.fleet, target.name),
                    Some(&json!({"properties": properties})),
                )
                .await?;
            print(format, &v, || one_row(&v, MEMBER_COLUMNS, colour))?;
        }
        MemberCommand::Update {
            target,
            update_group,
            labels: pairs,
        } => {
            if update_group.is_none() && pairs.is_none() {
                bail!("nothing to update: give --update-group and/or --labels");
            }
            let mut properties = json!({});
            if let Some(g) = update_group {
                properties["group"] = json!(g);
            }
            if let Some(p) = pairs {
                properties["labels"] = json!(labels(&p)?);
            }
            let v = client
                .send(
                    reqwest::Method::PATCH,
                    &format!("/v1/fleets/{}/members/{}", target.fleet, target.name),
                    Some(&json!({"properties": properties})),
                )
                .await?;
            print(format, &v, || one_row(&v, MEMBER_COLUMNS, colour))?;
        }
        MemberCommand::Show { target } => {
            let v = client
                .get(&format!(
                    "/v1/fleets/{}/members/{}",
                    target.fleet, target.name
                ))
                .await?;
            print(format, &v, || one_row(&v, MEMBER_COLUMNS, colour))?;
        }
        MemberCommand::Discover { fleet } => {
            let v = client
                .send(
                    reqwest::Method::POST,
                    &format!("/v1/fleets/{}/discoverMembers", fleet.fleet),
                    None,
                )
                .await?;
            print(format, &v, || {
                ["added", "updated", "vanished"]
                    .iter()
                    .map(|k| {
                        let names: Vec<&str> = v[*k]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .collect();
                        format!("{k} {}: {}\n", names.len(), names.join(", "))
                    })
                    .collect()
            })?;
        }
        MemberCommand::Reconcile { target } => {
            let path = format!("/v1/fleets/{}/members/{}", target.fleet, target.name);
            // What a GET answers is a valid PUT of the same member.
            let current = client.get(&path).await?;
            let v = client
                .send(reqwest::Method::PUT, &path, Some(&current))
                .await?;
            print(format, &v, || one_row(&v, MEMBER_COLUMNS, colour))?;
        }
        MemberCommand::Wait { target, wait } => {
            let path = format!("/v1/fleets/{}/members/{}", target.fleet, target.name);
            return wait_for(
                client,
                &path,
                &format!("member {}", target.name),
                &wait,
                never_ends,
            )
            .await;
        }
        MemberCommand::List { fleet } => {
            let items = client
                .list_all(&format!("/v1/fleets/{}/members", fleet.fleet))
                .await?;
            print(format, &Value::Array(items.clone()), || {
                resource_rows(&items, MEMBER_COLUMNS, colour)
            })?;
        }
        MemberCommand::Delete { target } => {
            client
                .send(
                    reqwest::Method::DELETE,
                    &format!("/v1/fleets/{}/members/{}", target.fleet, target.name),
                    None,
                )
                .await?;
            eprintln!("deleted member {}", target.name);
        }
        MemberCommand::Import {
            fleet,
            file,
            upsert,
        } => {
            let text = if file == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&file).with_context(|| format!("cannot read {file}"))?
            };
            let members = parse_member_file(&text).with_context(|| file.clone())?;
            let (mut created, mut updated) = (0, 0);
            for (batch, chunk) in members.chunks(IMPORT_BATCH).enumerate() {
                let body =
                    json!({"mode": if upsert { "Upsert" } else { "Create" }, "value": chunk});
                let answer = client
                    .send(
                        reqwest::Method::POST,
                        &format!("/v1/fleets/{}/importMembers", fleet.fleet),
                        Some(&body),
                    )
                    .await
                    .with_context(|| {
                        format!(
                            "members {} to {} (value[i] counts from member {}); the earlier ones are registered",
                            batch * IMPORT_BATCH + 1,
                            batch * IMPORT_BATCH + chunk.len(),
                            batch * IMPORT_BATCH + 1
                        )
                    })?;
                created += answer["created"].as_u64().unwrap_or(0);
                updated += answer["updated"].as_u64().unwrap_or(0);
            }
            let summary = json!({"created": created, "updated": updated});
            print(format, &summary, || {
                format!("created {created}, updated {updated}\n")
            })?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Members per import request: the server's limit.
const IMPORT_BATCH: usize = 10_000;

/// A members file as the API's items: JSON (an array, or `{"value": [...]}`), JSON lines, or
/// CSV with the header `name,clusterResourceId,group,labels` (labels `k=v;k2=v2`).
fn parse_member_file(text: &str) -> anyhow::Result<Vec<Value>> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') || trimmed.starts_with("{\"value\"") {
        let value: Value = serde_json::from_str(text).context("not valid JSON")?;
        return match value {
            Value::Array(items) => Ok(items),
            Value::Object(mut o) => match o.remove("value") {
                Some(Value::Array(items)) => Ok(items),
                _ => bail!("\"value\" must be an array of members"),
            },
            _ => bail!("expected an array of members"),
        };
    }
    if trimmed.starts_with('{') {
        return text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).with_context(|| format!("line {}: not valid JSON", i + 1))
            })
            .collect();
    }
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let header: Vec<String> = match lines.next() {
        Some((_, h)) => h.split(',').map(|c| c.trim().to_string()).collect(),
        None => return Ok(Vec::new()),
    };
    let column = |name: &str| header.iter().position(|c| c == name);
    let (Some(name_at), Some(id_at)) = (column("name"), column("clusterResourceId")) else {
        bail!(
            "line 1: the CSV header must name the columns name,clusterResourceId[,group][,labels]"
        );
    };
    if let Some(unknown) = header.iter().find(|c| {
        !matches!(
            c.as_str(),
            "name" | "clusterResourceId" | "group" | "labels"
        )
    }) {
        bail!(
            "line 1: unknown column {unknown:?}; the columns are name,clusterResourceId,group,labels"
        );
    }
    let (group_at, labels_at) = (column("group"), column("labels"));
    lines
        .map(|(i, line)| {
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            if cells.len() != header.len() {
                bail!(
                    "line {}: {} cells where the header has {} (commas cannot appear inside a cell)",
                    i + 1,
                    cells.len(),
                    header.len()
                );
            }
            let mut properties = json!({"clusterResourceId": cells[id_at]});
            if let Some(g) = group_at.map(|k| cells[k]).filter(|g| !g.is_empty()) {
                properties["group"] = json!(g);
            }
            if let Some(l) = labels_at.map(|k| cells[k]).filter(|l| !l.is_empty()) {
                let pairs: Vec<String> = l.split(';').map(String::from).collect();
                properties["labels"] =
                    json!(labels(&pairs).with_context(|| format!("line {}", i + 1))?);
            }
            Ok(json!({"name": cells[name_at], "properties": properties}))
        })
        .collect()
}

pub async fn strategy(
    client: &Client,
    format: Option<Format>,
    command: StrategyCommand,
) -> anyhow::Result<ExitCode> {
    let format = default_format(format);
    let columns: &[(&str, &[&str])] = &[("name", &["name"])];
    let stage_count = |v: &Value| {
        v["properties"]["strategy"]["stages"]
            .as_array()
            .map_or(0, Vec::len)
    };
    match command {
        StrategyCommand::Create { target, stages } => {
            let strategy = file_or_json(&stages, "--stages")?;
            let v = client
                .send(
                    reqwest::Method::PUT,
                    &format!(
                        "/v1/fleets/{}/updateStrategies/{}",
                        target.fleet, target.name
                    ),
                    Some(&json!({"properties": {"strategy": strategy}})),
                )
                .await?;
            print(format, &v, || {
                format!(
                    "update strategy {} with {} stages\n",
                    target.name,
                    stage_count(&v)
                )
            })?;
        }
        StrategyCommand::Show { target } => {
            let v = client
                .get(&format!(
                    "/v1/fleets/{}/updateStrategies/{}",
                    target.fleet, target.name
                ))
                .await?;
            print(format, &v, || strategy_text(&v))?;
        }
        StrategyCommand::Wait { target, wait } => {
            let path = format!(
                "/v1/fleets/{}/updateStrategies/{}",
                target.fleet, target.name
            );
            return wait_for(
                client,
                &path,
                &format!("update strategy {}", target.name),
                &wait,
                never_ends,
            )
            .await;
        }
        StrategyCommand::List { fleet } => {
            let items = client
                .list_all(&format!("/v1/fleets/{}/updateStrategies", fleet.fleet))
                .await?;
            print(format, &Value::Array(items.clone()), || {
                resource_rows(&items, columns, false)
            })?;
        }
        StrategyCommand::Delete { target } => {
            client
                .send(
                    reqwest::Method::DELETE,
                    &format!(
                        "/v1/fleets/{}/updateStrategies/{}",
                        target.fleet, target.name
                    ),
                    None,
                )
                .await?;
            eprintln!("deleted update strategy {}", target.name);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn strategy_text(v: &Value) -> String {
    let mut out = format!("update strategy {}\n", s(v, &["name"]));
    for stage in v["properties"]["strategy"]["stages"]
        .as_array()
        .into_iter()
        .flatten()
    {
        out.push_str(&format!(
            "  stage {}  maxConcurrency {}  maxAllowedFailures {}  wait {}s\n",
            s(stage, &["name"]),
            stage
                .get("maxConcurrency")
                .map_or("50 (default)".into(), |c| c
                    .to_string()
                    .trim_matches('"')
                    .to_string()),
            stage
                .get("maxAllowedFailures")
                .map_or("0 (default)".into(), |c| c
                    .to_string()
                    .trim_matches('"')
                    .to_string()),
            stage["afterStageWaitInSeconds"].as_i64().unwrap_or(0)
        ));
        for g in stage["groups"].as_array().into_iter().flatten() {
            out.push_str(&format!("    group {}\n", s(g, &["name"])));
        }
    }
    out
}

/// Exit codes of `updaterun wait` and `watch`: how the run ended. 0 completed (or skipped), 4
/// failed, 5 stopped, 6 completed with tolerated failures; 1 if it has not ended. (3 is "not
/// found", as in `az`; 2 any other error.)
pub fn outcome_code(run: &Value) -> ExitCode {
    let status = &run["properties"]["status"];
    match (
        s(status, &["status", "state"]),
        status["failureCount"].as_u64().unwrap_or(0),
    ) {
        ("Completed", 0) | ("Skipped", _) => ExitCode::SUCCESS,
        ("Completed", _) => ExitCode::from(6),
        ("Failed", _) => ExitCode::from(4),
        ("Stopped", _) => ExitCode::from(5),
        _ => ExitCode::from(1),
    }
}

fn finished(run: &Value) -> bool {
    let status = &run["properties"]["status"]["status"];
    match s(status, &["state"]) {
        "Completed" | "Skipped" | "Stopped" => true,
        "Failed" => status["completedTime"].is_string(),
        _ => false,
    }
}

/// `updaterun forecast` as text: the end, a line per stage and group with its predicted
/// times, the critical path, and where the durations came from.
pub fn forecast_table(forecast: &Value) -> String {
    let time = |v: &Value| v.as_str().unwrap_or("never").to_string();
    // The gates it assumes approved, said with the end (SEMANTICS §11: the assumptions used).
    let approvals: Vec<&str> = forecast["assumptions"]["pendingGates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["type"] == "Approval")
        .filter_map(|g| g["displayName"].as_str().or(g["gateId"].as_str()))
        .collect();
    let condition = match (approvals.as_slice(), &forecast["assumptions"]["approvals"]) {
        ([], _) => String::new(),
        (gates, a) if a == "IfApprovedNow" => {
            format!(" if {} approved now", gate_names(gates))
        }
        (gates, _) => format!(
            " if {} approved {} s from now",
            gate_names(gates),
            forecast["assumptions"]["approvalDelaySeconds"]
        ),
    };
    let mut out = format!(
        "forecast at {}: the run ends {}{condition}\n\n",
        time(&forecast["computedAt"]),
        time(&forecast["completedTime"])
    );
    out.push_str(&format!(
        "{:<28} {:<22} {:<22} {:>7}\n",
        "STAGE / GROUP", "START", "END", "MEMBERS"
    ));
    for stage in forecast["stages"].as_array().into_iter().flatten() {
        let members: usize = stage["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| g["members"].as_array().map_or(0, Vec::len))
            .sum();
        out.push_str(&format!(
            "{:<28} {:<22} {:<22} {members:>7}\n",
            s(stage, &["name"]),
            time(&stage["startTime"]),
            time(&stage["completedTime"])
        ));
        let holds: Vec<String> = stage["waitsFor"]
            .as_array()
            .into_iter()
            .flatten()
            .map(hold_text)
            .collect();
        if !holds.is_empty() {
            out.push_str(&format!("  waits for {}\n", holds.join("; ")));
        }
        for group in stage["groups"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  {:<26} {:<22} {:<22} {:>7}\n",
                s(group, &["name"]),
                time(&group["startTime"]),
                time(&group["completedTime"]),
                group["members"].as_array().map_or(0, Vec::len)
            ));
        }
    }
    out.push_str("\ncritical path:\n");
    for step in forecast["criticalPath"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {:<8} {:<36} {} → {}\n",
            s(step, &["kind"]),
            s(step, &["name"]),
            time(&step["from"]),
            time(&step["to"])
        ));
    }
    let d = &forecast["assumptions"]["durations"];
    out.push_str(&format!(
        "\ndurations: {} from the member's history, {} from the fleet's, {} from the driver, {} default ({} s); approvals {} s after they are reached\n",
        d["history"],
        d["fleetMedian"],
        d["driver"],
        d["default"],
        forecast["assumptions"]["defaultDurationSeconds"],
        forecast["assumptions"]["approvalDelaySeconds"]
    ));
    out
}

/// `gate "Go to production"` or `gates "a", "b"`.
fn gate_names(gates: &[&str]) -> String {
    let quoted: Vec<String> = gates.iter().map(|g| format!("{g:?}")).collect();
    match quoted.as_slice() {
        [one] => format!("gate {one} is"),
        many => format!("gates {} are", many.join(", ")),
    }
}

/// One entry of a forecast's `waitsFor` of a stage, in words, with when it is predicted to end.
fn hold_text(hold: &Value) -> String {
    let until = hold["until"].as_str().unwrap_or("never");
    let gate = || {
        hold["displayName"]
            .as_str()
            .or(hold["gateId"].as_str())
            .unwrap_or("?")
            .to_string()
    };
    let what = match hold["kind"].as_str().unwrap_or("?") {
        "Approval" => format!("approval of gate {:?}", gate()),
        "ScheduledStart" => format!("scheduled gate {:?}", gate()),
        "HealthCheck" => format!("health checks of gate {:?}", gate()),
        "Wait" => format!("the wait after stage {}", s(hold, &["stage"])),
        "Stage" => format!("stage {}", s(hold, &["stage"])),
        kind => format!("{kind} ({} members)", hold["members"]),
    };
    format!("{what} until {until}")
}

/// One line comparing two forecasts' ends.
fn compare_forecasts(run: &Value, what_if: &Value) -> String {
    let end = |v: &Value| {
        v["completedTime"]
            .as_str()
            .and_then(|t| flotilla_engine::time::Time::parse(t).ok())
    };
    match (end(run), end(what_if)) {
        (Some(a), Some(b)) => {
            let minutes = (b.unix() - a.unix()) as f64 / 60.0;
            let how = if minutes < 0.0 { "earlier" } else { "later" };
            format!(
                "the what-if ends {b}, {:.0} minutes {how} than the run ({a})\n",
                minutes.abs()
            )
        }
        (a, b) => format!(
            "the run ends {}, the what-if {}\n",
            a.map_or("never".into(), |t| t.to_string()),
            b.map_or("never".into(), |t| t.to_string())
        ),
    }
}

/// The tree of `updaterun show`.
pub fn run_tree(run: &Value, colour: bool) -> String {
    let name = s(run, &["name"]);
    let Ok(status) = serde_json::from_value::<UpdateRunStatus>(run["properties"]["status"].clone())
    else {
        return format!("update run {name}: status unreadable\n");
    };
    let mut out = flotilla_sim::render::tree(name, &status);
    if let Some(from) = &status.promoted_from {
        out.push_str(&format!(
            "promoted from {} (completed {}){}\n",
            from.run_id,
            from.completed_time,
            if from.images_pinned {
                ""
            } else {
                "; node images not pinned: the fleet's driver cannot pin them"
            }
        ));
    }
    // Only a profile's runs validate anything for the profiles that follow it (SEMANTICS §14).
    if let Some(ended) = status
        .ended_on
        .as_ref()
        .filter(|_| run["properties"]["autoUpgradeProfileId"].is_string())
    {
        let versions: Vec<String> = ended
            .kubernetes_version
            .iter()
            .map(|v| v.to_string())
            .chain(ended.node_image_versions.iter().map(|i| i.version.clone()))
            .collect();
        out.push_str(&format!(
            "ended on {}; {}\n",
            versions.join(", "),
            match &ended.message {
                None => "validates its target for downstream profiles".to_string(),
                Some(why) => format!("validates nothing downstream: {why}"),
            }
        ));
    }
    for warning in &status.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    if colour {
        for word in [
            "Completed",
            "Running",
            "Pending",
            "Stopped",
            "Failed",
            "Skipped",
            "NotStarted",
        ] {
            out = out.replace(
                &format!("  {word}  "),
                &format!("  {}  ", state(word, true)),
            );
            out = out.replace(
                &format!("  {word}\n"),
                &format!("  {}\n", state(word, true)),
            );
        }
    }
    out
}

fn progress_lines(run: &Value) -> String {
    let mut out = String::new();
    for stage in run["properties"]["status"]["stages"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let mut total = 0;
        let mut done = 0;
        let mut running = 0;
        for g in stage["groups"].as_array().into_iter().flatten() {
            for m in g["members"].as_array().into_iter().flatten() {
                total += 1;
                match s(m, &["status", "state"]) {
                    "Completed" | "Failed" | "Skipped" => done += 1,
                    "Running" => running += 1,
                    _ => {}
                }
            }
        }
        let width: usize = 30;
        let filled = (done * width).checked_div(total).unwrap_or(width);
        out.push_str(&format!(
            "{:<20} [{}{}] {done}/{total} done, {running} running  {}\n",
            s(stage, &["name"]),
            "#".repeat(filled),
            ".".repeat(width - filled),
            s(stage, &["status", "state"])
        ));
    }
    out
}

/// Starts or stops a run, and shows its state.
async fn run_action(
    client: &Client,
    format: Format,
    colour: bool,
    path: &str,
    name: &str,
    action: &str,
) -> anyhow::Result<()> {
    let v = client
        .send(reqwest::Method::POST, &format!("{path}/{action}"), None)
        .await?;
    print(format, &v, || {
        format!(
            "update run {name} {}\n",
            state(s(&v, &["properties", "status", "status", "state"]), colour)
        )
    })
}

pub async fn run(
    client: &Client,
    format: Option<Format>,
    command: RunCommand,
) -> anyhow::Result<ExitCode> {
    let format = default_format(format);
    let colour = colour_enabled();
    let path = |t: &Target| format!("/v1/fleets/{}/updateRuns/{}", t.fleet, t.name);
    match command {
        RunCommand::Create {
            target,
            upgrade_type,
            kubernetes_version,
            node_image_selection,
            custom_node_image_versions,
            stages,
            update_strategy_name,
            chain_minor_versions,
        } => {
            // The checks and messages of `az fleet updaterun create`.
            match (upgrade_type.as_str(), &kubernetes_version) {
                ("NodeImageOnly", Some(_)) => {
                    bail!("Cannot set kubernetes version when upgrade type is 'NodeImageOnly'.")
                }
                (t @ ("Full" | "ControlPlaneOnly"), None) => {
                    bail!("Please set kubernetes version when upgrade type is '{t}'.")
                }
                _ => {}
            }
            if stages.is_some() && update_strategy_name.is_some() {
                bail!("Cannot set stages when update strategy name is set.");
            }
            if update_strategy_name
                .as_deref()
                .is_some_and(|n| n.trim().is_empty())
            {
                bail!("--update-strategy-name must not be blank");
            }
            let version = kubernetes_version.map(|v| v.trim_start_matches(['v', 'V']).to_string());
            let mut upgrade = json!({"type": upgrade_type});
            if let Some(v) = version {
                upgrade["kubernetesVersion"] = json!(v);
            }
            let mut update = json!({"upgrade": upgrade});
            let selection = node_image_selection.unwrap_or_else(|| {
                if custom_node_image_versions.is_empty() {
                    "Latest".into()
                } else {
                    "Custom".into()
                }
            });
            if selection != "Custom" && !custom_node_image_versions.is_empty() {
                bail!("--custom-node-image-versions needs --node-image-selection Custom");
            }
            update["nodeImageSelection"] = json!({"type": selection});
            if !custom_node_image_versions.is_empty() {
                update["nodeImageSelection"]["customNodeImageVersions"] = Value::Array(
                    custom_node_image_versions
                        .iter()
                        .map(|v| json!({"version": v}))
                        .collect(),
                );
            }
            let mut properties = json!({"managedClusterUpdate": update});
            if chain_minor_versions {
                properties["chainMinorVersions"] = json!(true);
            }
            if let Some(stages) = stages {
                properties["strategy"] = file_or_json(&stages, "--stages")?;
            }
            if let Some(name) = update_strategy_name {
                properties["updateStrategyId"] = json!(format!(
                    "/v1/fleets/{}/updateStrategies/{name}",
                    target.fleet
                ));
            }
            let v = client
                .send(
                    reqwest::Method::PUT,
                    &path(&target),
                    Some(&json!({"properties": properties})),
                )
                .await?;
            print(format, &v, || run_tree(&v, colour))?;
            for warning in v["properties"]["status"]["warnings"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                eprintln!("warning: {warning}");
            }
            eprintln!(
                "created; start it with: flotilla updaterun start -f {} -n {}",
                target.fleet, target.name
            );
        }
        RunCommand::Start { target } => {
            run_action(
                client,
                format,
                colour,
                &path(&target),
                &target.name,
                "start",
            )
            .await?;
        }
        RunCommand::Stop { target } => {
            run_action(client, format, colour, &path(&target), &target.name, "stop").await?;
        }
        RunCommand::Rollback { target } => {
            let v = client
                .send(
                    reqwest::Method::POST,
                    &format!("{}/rollback", path(&target)),
                    None,
                )
                .await?;
            print(format, &v, || {
                let made = s(&v, &["name"]);
                format!(
                    "update run {made} rolls back {} and is {}\n{}\napprove its gate to begin: flotilla gate list -f {} --state Pending\n",
                    target.name,
                    state(s(&v, &["properties", "status", "status", "state"]), colour),
                    run_tree(&v, colour),
                    target.fleet,
                )
            })?;
        }
        RunCommand::Skip { target, targets } => {
            const KINDS: [&str; 4] = ["Member", "Group", "Stage", "AfterStageWait"];
            let mut parsed = Vec::new();
            for t in &targets {
                let mut parts = t.splitn(3, ':');
                // The type matches in any case, as every enum value of the command line does.
                let kind = parts
                    .next()
                    .and_then(|k| KINDS.iter().find(|c| c.eq_ignore_ascii_case(k)));
                match (kind, parts.next(), parts.next()) {
                    (Some(kind), Some(name), None) if !name.is_empty() => {
                        parsed.push(json!({"type": kind, "name": name}));
                    }
                    _ => bail!(
                        "--targets {t:?}: write Type:Name with Type one of Member, Group, Stage, AfterStageWait"
                    ),
                }
            }
            let v = client
                .send(
                    reqwest::Method::POST,
                    &format!("{}/skip", path(&target)),
                    Some(&json!({"targets": parsed})),
                )
                .await?;
            print(format, &v, || run_tree(&v, colour))?;
        }
        RunCommand::Show { target } => {
            let v = client.get(&path(&target)).await?;
            print(format, &v, || run_tree(&v, colour))?;
        }
        RunCommand::Forecast {
            target,
            approval_delay,
            default_duration,
            what_if,
            stages,
            kubernetes_version,
        } => {
            let mut body = serde_json::Map::new();
            if let Some(d) = approval_delay {
                body.insert("approvalDelaySeconds".into(), json!(d));
            }
            if let Some(d) = default_duration {
                body.insert("defaultDurationSeconds".into(), json!(d));
            }
            let v = client
                .send(
                    reqwest::Method::POST,
                    &format!("{}/forecast", path(&target)),
                    Some(&Value::Object(body.clone())),
                )
                .await?;
            if !what_if {
                print(format, &v, || forecast_table(&v))?;
                return Ok(ExitCode::SUCCESS);
            }
            // The run as it is, with the stages or target asked for instead.
            let run = client.get(&path(&target)).await?;
            let mut properties = json!({
                "managedClusterUpdate": run["properties"]["managedClusterUpdate"].clone(),
            });
            properties["strategy"] = match &stages {
                Some(stages) => file_or_json(stages, "--stages")?,
                None => run["properties"]["strategy"].clone(),
            };
            if properties["strategy"].is_null() {
                properties.as_object_mut().map(|p| p.remove("strategy"));
            }
            if let Some(version) = &kubernetes_version {
                properties["managedClusterUpdate"]["upgrade"]["kubernetesVersion"] =
                    json!(version.trim_start_matches('v'));
            }
            body.insert("run".into(), json!({"properties": properties}));
            let other = client
                .send(
                    reqwest::Method::POST,
                    &format!("/v1/fleets/{}/forecast", target.fleet),
                    Some(&Value::Object(body)),
                )
                .await?;
            let both = json!({"run": v, "whatIf": other});
            print(format, &both, || {
                format!(
                    "{}\n── what if ──\n\n{}\n{}",
                    forecast_table(&v),
                    forecast_table(&other),
                    compare_forecasts(&v, &other)
                )
            })?;
        }
        RunCommand::List { fleet } => {
            let items = client
                .list_all(&format!("/v1/fleets/{}/updateRuns", fleet.fleet))
                .await?;
            print(format, &Value::Array(items.clone()), || {
                resource_rows(&items, RUN_COLUMNS, colour)
            })?;
        }
        RunCommand::Delete { target } => {
            client
                .send(reqwest::Method::DELETE, &path(&target), None)
                .await?;
            eprintln!("deleted update run {}", target.name);
        }
        RunCommand::Wait { target, wait } if wait.any() => {
            let what = format!("update run {}", target.name);
            return wait_for(client, &path(&target), &what, &wait, run_ended).await;
        }
        RunCommand::Wait { target, wait } => {
            let timeout = wait.timeout;
            let deadline = Instant::now() + Duration::from_secs(timeout);
            loop {
                let v = client.get(&path(&target)).await?;
                if finished(&v) {
                    print(format, &v, || {
                        format!(
                            "update run {} {}  failures {}\n",
                            target.name,
                            state(s(&v, &["properties", "status", "status", "state"]), colour),
                            v["properties"]["status"]["failureCount"]
                        )
                    })?;
                    return Ok(outcome_code(&v));
                }
                if Instant::now() >= deadline {
                    eprintln!(
                        "flotilla: update run {} is still {} after {timeout}s",
                        target.name,
                        s(&v, &["properties", "status", "status", "state"])
                    );
                    return Ok(ExitCode::from(1));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        RunCommand::Watch { target } => return watch(client, &target).await,
        RunCommand::Rerun { target, new_name } => {
            let old = client.get(&path(&target)).await?;
            if let Some(of) = old["properties"]["rollbackOf"].as_str() {
                bail!(
                    "update run {} is the rollback run of {of}; a rollback run cannot be re-run (its targets are where {of} found each member)",
                    target.name
                );
            }
            if !finished(&old) {
                bail!(
                    "update run {} is {}; only a finished run can be re-run",
                    target.name,
                    s(&old, &["properties", "status", "status", "state"])
                );
            }
            let mut properties =
                json!({"managedClusterUpdate": old["properties"]["managedClusterUpdate"]});
            if !old["properties"]["strategy"].is_null() {
                properties["strategy"] = old["properties"]["strategy"].clone();
            }
            let new = Target {
                fleet: target.fleet.clone(),
                name: new_name.clone(),
                az: AzScope::default(),
            };
            let v = client
                .send(
                    reqwest::Method::PUT,
                    &path(&new),
                    Some(&json!({"properties": properties})),
                )
                .await?;
            print(format, &v, || run_tree(&v, colour))?;
            eprintln!(
                "created {new_name} from {}; start it with: flotilla updaterun start -f {} -n {new_name}",
                target.name, target.fleet
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `watch` knows of a run: its state when `watch` began (one GET, and the log as it was
/// then for what gates and waits said), then each new event: each member's stage and state,
/// members in flight, gates waiting, waits running, and the failures with their messages.
struct Watched {
    stages: Vec<String>,
    member_stage: BTreeMap<String, usize>,
    member_state: BTreeMap<String, String>,
    in_flight: std::collections::BTreeSet<String>,
    /// Gates pending: what to say, since when, and when a scheduled one opens.
    gates: BTreeMap<String, Countdown>,
    /// Waits running, by stage: until when.
    waits: BTreeMap<String, Countdown>,
    failures: BTreeMap<String, String>,
    failed: bool,
    ended: bool,
}

/// A line of `watch` that counts: down to `until` when known, else up from `since`.
struct Countdown {
    label: String,
    since: Option<Time>,
    until: Option<Time>,
}

impl Countdown {
    /// From an event: its time, and the time its message ends with (`until T`, `opens at T`).
    fn of(label: String, event: &Value) -> Countdown {
        let message = s(event, &["message"]);
        Countdown {
            label,
            since: Time::parse(s(event, &["time"])).ok(),
            until: message.rsplit(' ').next().and_then(|t| Time::parse(t).ok()),
        }
    }

    fn line(&self, now: Time) -> String {
        match (self.until, self.since) {
            (Some(until), _) if until.0 > now.0 => {
                format!("{} ({} left)", self.label, short_duration(until.0 - now.0))
            }
            (Some(_), _) => format!("{} (due now)", self.label),
            (None, Some(since)) => format!(
                "{} (for {})",
                self.label,
                short_duration((now.0 - since.0).max(0))
            ),
            (None, None) => self.label.clone(),
        }
    }
}

/// `1h 05m`, `4m 10s`, `12s`.
fn short_duration(seconds: i64) -> String {
    let (h, m, sec) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    if h > 0 {
        format!("{h}h {m:02}m")
    } else if m > 0 {
        format!("{m}m {sec:02}s")
    } else {
        format!("{sec}s")
    }
}

/// What a waiting gate's line says: where, its id (what `gate approve -n` takes), and the
/// gate's message (`prod: gate 3f2c… waiting: Go to production`).
fn gate_label(stage: &str, group: &str, gate: &str, message: &str) -> String {
    let place = if group.is_empty() {
        stage.to_string()
    } else {
        format!("{stage}/{group}")
    };
    let message = if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    };
    format!("{place}: gate {gate} waiting{message}")
}

impl Watched {
    /// The run as one GET found it; `history`, its log up to then, only for what the gates and
    /// waits still open said when they began (when a scheduled gate opens, when a wait ends).
    fn new(run: &Value, history: &[Value]) -> Watched {
        let status = &run["properties"]["status"];
        let mut w = Watched {
            stages: Vec::new(),
            member_stage: BTreeMap::new(),
            member_state: BTreeMap::new(),
            in_flight: Default::default(),
            gates: BTreeMap::new(),
            waits: BTreeMap::new(),
            failures: BTreeMap::new(),
            failed: s(status, &["status", "state"]) == "Failed",
            ended: finished(run),
        };
        let began = |kind: &str, key: &str, value: &str| {
            history
                .iter()
                .rev()
                .find(|e| s(e, &["type"]) == kind && s(e, &[key]) == value)
        };
        let mut gates = |stage: &str, group: &str, list: &Value| {
            for gate in list.as_array().into_iter().flatten() {
                if s(gate, &["status", "state"]) != "Pending" {
                    continue;
                }
                let id = s(gate, &["gateId"]);
                let countdown = match began("GatePending", "gate", id) {
                    Some(event) => {
                        let label = gate_label(stage, group, id, s(event, &["message"]));
                        Countdown::of(label, event)
                    }
                    None => Countdown {
                        label: gate_label(stage, group, id, s(gate, &["displayName"])),
                        since: Time::parse(s(gate, &["status", "startTime"])).ok(),
                        until: None,
                    },
                };
                w.gates.insert(id.to_string(), countdown);
            }
        };
        for stage in status["stages"].as_array().into_iter().flatten() {
            let name = s(stage, &["name"]);
            gates(name, "", &stage["beforeGates"]);
            gates(name, "", &stage["afterGates"]);
            for g in stage["groups"].as_array().into_iter().flatten() {
                gates(name, s(g, &["name"]), &g["beforeGates"]);
                gates(name, s(g, &["name"]), &g["afterGates"]);
            }
        }
        for (si, stage) in status["stages"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let name = s(stage, &["name"]).to_string();
            let wait = &stage["afterStageWaitStatus"];
            if s(wait, &["status", "state"]) == "Running" {
                let countdown = match began("WaitStarted", "stage", &name) {
                    Some(event) => {
                        Countdown::of(format!("{name}: waiting {}", s(event, &["message"])), event)
                    }
                    None => {
                        let since = Time::parse(s(wait, &["status", "startTime"])).ok();
                        let seconds = wait["waitDurationInSeconds"].as_i64().unwrap_or(0);
                        Countdown {
                            label: format!("{name}: waiting"),
                            since,
                            until: since.map(|t| Time(t.0.saturating_add(seconds))),
                        }
                    }
                };
                w.waits.insert(name.clone(), countdown);
            }
            w.stages.push(name);
            for g in stage["groups"].as_array().into_iter().flatten() {
                for m in g["members"].as_array().into_iter().flatten() {
                    let name = s(m, &["name"]).to_string();
                    let state = s(m, &["status", "state"]).to_string();
                    if state == "Running" {
                        w.in_flight.insert(name.clone());
                    }
                    if state == "Failed"
                        && let Some(message) = m["status"]["error"]["message"].as_str()
                    {
                        w.failures.insert(name.clone(), message.to_string());
                    }
                    w.member_stage.insert(name.clone(), si);
                    w.member_state.insert(name, state);
                }
            }
        }
        w
    }

    /// Applies one event that followed the state `watch` began from. A member Completed or
    /// Skipped stays so: an event the first GET had already seen (the stream picks up where
    /// the log was a moment before that GET) never moves a bar backwards.
    fn apply(&mut self, event: &Value) {
        let member = s(event, &["member"]).to_string();
        let stage = s(event, &["stage"]).to_string();
        let message = s(event, &["message"]).to_string();
        let settled = self
            .member_state
            .get(&member)
            .is_some_and(|st| matches!(st.as_str(), "Completed" | "Skipped"));
        match s(event, &["type"]) {
            "MemberStarted" | "MemberReattached" | "MemberSucceeded" | "MemberFailed"
            | "MemberSkipped" | "MemberStopped" | "MemberPending"
                if settled => {}
            "MemberStarted" | "MemberReattached" => {
                self.in_flight.insert(member.clone());
                self.member_state.insert(member, "Running".into());
            }
            kind @ ("MemberSucceeded" | "MemberFailed" | "MemberSkipped" | "MemberStopped"
            | "MemberPending") => {
                self.in_flight.remove(&member);
                let state = kind.trim_start_matches("Member");
                let state = if state == "Succeeded" {
                    "Completed"
                } else {
                    state
                };
                if state == "Failed" {
                    self.failures.insert(member.clone(), message);
                }
                self.member_state.insert(member, state.to_string());
            }
            "GatePending" => {
                let gate = s(event, &["gate"]);
                let label = gate_label(&stage, s(event, &["group"]), gate, &message);
                self.gates
                    .insert(gate.to_string(), Countdown::of(label, event));
            }
            "GateCompleted" | "GateSkipped" => {
                self.gates.remove(s(event, &["gate"]));
            }
            "WaitStarted" => {
                let label = format!("{stage}: waiting {message}");
                self.waits.insert(stage, Countdown::of(label, event));
            }
            "WaitCompleted" | "WaitSkipped" => {
                self.waits.remove(&stage);
            }
            "RunStarted" => {
                self.failed = false;
                self.ended = false;
            }
            "RunFailed" => self.failed = true,
            "RunCompleted" | "RunSkipped" | "RunStopped" => self.ended = true,
            _ => {}
        }
        // A failed run ends when its last member in flight has finished.
        if self.failed && self.in_flight.is_empty() {
            self.ended = true;
        }
    }

    /// A line per stage, then a line per gate and wait in progress, counting at `now`.
    fn lines(&self, now: Time) -> Vec<String> {
        let mut lines = Vec::new();
        for (si, name) in self.stages.iter().enumerate() {
            let states: Vec<&String> = self
                .member_stage
                .iter()
                .filter(|(_, s)| **s == si)
                .filter_map(|(m, _)| self.member_state.get(m))
                .collect();
            let total = states.len();
            let done = states
                .iter()
                .filter(|s| matches!(s.as_str(), "Completed" | "Failed" | "Skipped"))
                .count();
            let running = states.iter().filter(|s| **s == "Running").count();
            let failed = states.iter().filter(|s| **s == "Failed").count();
            let width: usize = 30;
            let filled = (done * width).checked_div(total).unwrap_or(width);
            lines.push(format!(
                "{name:<20} [{}{}] {done}/{total} done, {running} running, {failed} failed",
                "#".repeat(filled),
                ".".repeat(width - filled),
            ));
        }
        lines.extend(self.gates.values().map(|g| g.line(now)));
        lines.extend(self.waits.values().map(|w| w.line(now)));
        lines
    }
}

/// Follows a run from its state now over its new events to its last: on a terminal the
/// progress is redrawn in place (a line per stage, gate and wait), otherwise the state now is
/// printed once and then each new event is a plain line. The history is never replayed (bars
/// would go backwards). The log as it is now (its length is the id of its last event: a run's
/// events are numbered from 1), then one GET of the run before the stream and one after (the
/// outcome); none per event.
async fn watch(client: &Client, target: &Target) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    let path = format!("/v1/fleets/{}/updateRuns/{}", target.fleet, target.name);
    let log = client.get(&format!("{path}/events")).await?;
    let history = log["value"].as_array().cloned().unwrap_or_default();
    let run = client.get(&path).await?;
    let terminal = std::io::stdout().is_terminal();
    let mut watched = Watched::new(&run, &history);
    if !watched.ended {
        let mut stream = client
            .stream(&format!("{path}/events"), history.len())
            .await?;
        drop(history);
        if !terminal {
            for line in watched.lines(flotilla_server::clock::now()) {
                outln!("{line}");
            }
        }
        let mut buffer = String::new();
        let mut drawn = 0usize;
        // On a terminal the countdowns are redrawn every second, events or not.
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while !watched.ended {
            let chunk = tokio::select! {
                chunk = stream.chunk() => Some(chunk),
                _ = tick.tick(), if terminal => None,
            };
            if let Some(chunk) = chunk {
                let chunk = match chunk {
                    Ok(Some(c)) => c,
                    Ok(None) => bail!("the server closed the event stream"),
                    Err(e) => bail!("the event stream broke: {e}"),
                };
                buffer.push_str(&String::from_utf8_lossy(&chunk));
            }
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                for line in block.lines().filter_map(|l| l.strip_prefix("data: ")) {
                    let Ok(event) = serde_json::from_str::<Value>(line) else {
                        continue;
                    };
                    watched.apply(&event);
                    if !terminal {
                        let what = [
                            s(&event, &["stage"]),
                            s(&event, &["group"]),
                            s(&event, &["member"]),
                        ]
                        .into_iter()
                        .filter(|x| !x.is_empty())
                        .collect::<Vec<_>>()
                        .join("/");
                        outln!(
                            "{}  {}  {}{}",
                            s(&event, &["time"]),
                            s(&event, &["type"]),
                            what,
                            event["message"]
                                .as_str()
                                .map(|m| format!("  ({m})"))
                                .unwrap_or_default()
                        );
                    }
                }
            }
            if terminal {
                // Up over the last drawing, clear to the end, draw again.
                if drawn > 0 {
                    out!("\x1b[{drawn}A\x1b[J");
                }
                let lines = watched.lines(flotilla_server::clock::now());
                drawn = lines.len();
                for line in lines {
                    outln!("{line}");
                }
            }
        }
    }
    let run = client.get(&path).await?;
    if !terminal {
        out!("{}", progress_lines(&run));
    }
    outln!(
        "update run {} ended {} with {} failures",
        target.name,
        s(&run, &["properties", "status", "status", "state"]),
        run["properties"]["status"]["failureCount"]
    );
    // The failed members, from the run as it ended (also when it had ended before `watch`).
    for stage in run["properties"]["status"]["stages"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for g in stage["groups"].as_array().into_iter().flatten() {
            for m in g["members"].as_array().into_iter().flatten() {
                if s(m, &["status", "state"]) == "Failed" {
                    let message = m["status"]["error"]["message"]
                        .as_str()
                        .or_else(|| watched.failures.get(s(m, &["name"])).map(String::as_str))
                        .unwrap_or("");
                    outln!("  failed: {}: {message}", s(m, &["name"]));
                }
            }
        }
    }
    Ok(outcome_code(&run))
}

pub async fn gate(
    client: &Client,
    format: Option<Format>,
    command: GateCommand,
) -> anyhow::Result<ExitCode> {
    let format = default_format(format);
    let colour = colour_enabled();
    match command {
        GateCommand::List {
            fleet,
            run,
            stage,
            state,
            gate_type,
        } => {
            // A run or stage that is not there is said so, not answered with an empty list.
            if let Some(run) = &run {
                let found = client
                    .get(&format!("/v1/fleets/{}/updateRuns/{run}", fleet.fleet))
                    .await?;
                if let Some(stage) = &stage {
                    let stages: Vec<&str> = found["properties"]["status"]["stages"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|st| s(st, &["name"]))
                        .collect();
                    if !stages.contains(&stage.as_str()) {
                        bail!(
                            "--stage {stage:?}: update run {run} has no such stage (its stages: {})",
                            stages.join(", ")
                        );
                    }
                }
            }
            let query = state.map(|s| format!("?state={s}")).unwrap_or_default();
            let mut items = client
                .list_all(&format!("/v1/fleets/{}/gates{query}", fleet.fleet))
                .await?;
            let place = |g: &Value, key: &str| {
                g["properties"]["target"]["updateRunProperties"][key]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            };
            items.retain(|g| {
                gate_type
                    .as_deref()
                    .is_none_or(|kind| g["properties"]["gateType"] == kind)
                    && run.as_deref().is_none_or(|r| place(g, "name") == r)
                    && stage.as_deref().is_none_or(|st| place(g, "stage") == st)
            });
            print(format, &Value::Array(items.clone()), || {
                resource_rows(&items, GATE_COLUMNS, colour)
            })?;
        }
        GateCommand::Show { target } => {
            let v = client
                .get(&format!(
                    "/v1/fleets/{}/gates/{}",
                    target.fleet, target.name
                ))
                .await?;
            print(format, &v, || one_row(&v, GATE_COLUMNS, colour))?;
        }
        GateCommand::Approve { target }
        | GateCommand::Update {
            target,
            state: _, // "Completed", the one state a client may set
        } => {
            let v = client
                .send(
                    reqwest::Method::PATCH,
                    &format!("/v1/fleets/{}/gates/{}", target.fleet, target.name),
                    Some(&json!({"properties": {"state": "Completed"}})),
                )
                .await?;
            print(format, &v, || one_row(&v, GATE_COLUMNS, colour))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn server_token(
    client: &Client,
    format: Option<Format>,
    command: ServerTokenCommand,
) -> anyhow::Result<ExitCode> {
    let format = default_format(format);
    match command {
        ServerTokenCommand::List => {
            let v = client.get("/v1/tokens").await?;
            let items = v["value"].as_array().cloned().unwrap_or_default();
            let columns: &[(&str, &[&str])] = &[
                ("id", &["id"]),
                ("role", &["role"]),
                ("subject", &["subject"]),
                ("created", &["createdAt"]),
                ("revoked", &["revoked"]),
            ];
            print(format, &Value::Array(items.clone()), || {
                resource_rows(&items, columns, false)
            })?;
        }
        ServerTokenCommand::Revoke { id } => {
            client
                .send(reqwest::Method::DELETE, &format!("/v1/tokens/{id}"), None)
                .await?;
            eprintln!("revoked token {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn create_token_on_server(
    client: &Client,
    role: &str,
    subject: Option<String>,
) -> anyhow::Result<ExitCode> {
    let mut body = json!({"role": role});
    if let Some(s) = subject {
        body["subject"] = json!(s);
    }
    let v = client
        .send(reqwest::Method::POST, "/v1/tokens", Some(&body))
        .await?;
    outln!("{}", s(&v, &["token"]));
    eprintln!(
        "created {} token {} for {:?}; it is shown only this once",
        s(&v, &["role"]),
        s(&v, &["id"]),
        s(&v, &["subject"])
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn login(
    server: String,
    token: String,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    let client = Client::new(Some(server.clone()), Some(token.clone()), ca_file)?;
    client
        .get("/v1/fleets?$top=1")
        .await
        .context("the server refused the token")?;
    let path = write_config(&client.server, &token, ca_file)?;
    eprintln!(
        "logged in to {}; settings saved in {}",
        client.server,
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `flotilla login --oidc`: signs in through an identity provider the server names, with the
/// device authorization flow (RFC 8628): the user opens the provider's page anywhere and enters
/// the code shown; the access and refresh tokens go to the login file (0600), and later
/// commands renew the access token by themselves.
pub async fn login_oidc(
    server: String,
    provider: Option<String>,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    use crate::client::{OidcLogin, post_form};
    let client = Client::new(Some(server), Some(String::new()), ca_file)?;
    let listed: Value = client
        .http
        .get(format!("{}/auth/providers", client.server))
        .send()
        .await
        .with_context(|| format!("cannot reach the Flotilla server at {}", client.server))?
        .json()
        .await
        .context("the server's /auth/providers is not JSON")?;
    let providers: Vec<Value> = listed["value"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["cliClientId"].is_string())
        .collect();
    let names = || {
        providers
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let chosen = match &provider {
        Some(name) => providers
            .iter()
            .find(|p| p["name"] == json!(name))
            .with_context(|| {
                format!(
                    "--provider {name:?}: the server has no such identity provider (it has: {})",
                    names()
                )
            })?,
        None if providers.len() == 1 => &providers[0],
        None if providers.is_empty() => bail!(
            "the server at {} has no identity provider people sign in with (a provider with clientId or cliClientId)",
            client.server
        ),
        None => bail!(
            "the server has several identity providers; choose one with --provider ({})",
            names()
        ),
    };
    let issuer = chosen["issuer"]
        .as_str()
        .context("the provider has no issuer")?;
    let client_id = chosen["cliClientId"]
        .as_str()
        .context("the provider has no client id")?;
    let discovery_url = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    let discovery: Value = client
        .http
        .get(&discovery_url)
        .send()
        .await
        .with_context(|| format!("cannot reach the identity provider at {discovery_url}"))?
        .json()
        .await
        .with_context(|| format!("{discovery_url}: not JSON"))?;
    let device_endpoint = discovery["device_authorization_endpoint"]
        .as_str()
        .with_context(|| {
            format!("{issuer} offers no device authorization flow (device_authorization_endpoint)")
        })?;
    let token_endpoint = discovery["token_endpoint"]
        .as_str()
        .with_context(|| format!("{issuer}: no token_endpoint"))?
        .to_string();
    let mut scopes = vec!["openid", "profile", "offline_access"];
    for scope in chosen["scopes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    let scope = scopes.join(" ");
    let (status, device) = post_form(
        &client.http,
        device_endpoint,
        &[("client_id", client_id), ("scope", &scope)],
    )
    .await?;
    if !status.is_success() {
        bail!(
            "the identity provider refused the sign-in: {} {}",
            device["error"].as_str().unwrap_or(status.as_str()),
            device["error_description"].as_str().unwrap_or("")
        );
    }
    let device_code = device["device_code"]
        .as_str()
        .context("no device_code in the answer")?;
    let user_code = device["user_code"]
        .as_str()
        .context("no user_code in the answer")?;
    let uri = device["verification_uri"]
        .as_str()
        .context("no verification_uri in the answer")?;
    eprintln!("To sign in, open {uri} and enter the code {user_code}");
    if let Some(complete) = device["verification_uri_complete"].as_str() {
        eprintln!("(or open {complete})");
    }
    let mut interval = device["interval"].as_u64().unwrap_or(5).clamp(1, 60);
    let deadline = std::time::Instant::now()
        + std::time::Duration::from_secs(device["expires_in"].as_u64().unwrap_or(600).min(3600));
    let answer = loop {
        if std::time::Instant::now() >= deadline {
            bail!(
                "the code expired before the sign-in was completed; run `flotilla login --oidc` again"
            );
        }
        tokio::time::sleep(std::time::Duration::from_secs(interval)).await;
        let (status, answer) = post_form(
            &client.http,
            &token_endpoint,
            &[
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                ("device_code", device_code),
                ("client_id", client_id),
            ],
        )
        .await?;
        if status.is_success() {
            break answer;
        }
        match answer["error"].as_str() {
            Some("authorization_pending") => {}
            Some("slow_down") => interval += 5,
            other => bail!(
                "the sign-in was not completed: {} {}",
                other.unwrap_or(status.as_str()),
                answer["error_description"].as_str().unwrap_or("")
            ),
        }
    };
    let mut login = OidcLogin {
        issuer: issuer.to_string(),
        client_id: client_id.to_string(),
        token_endpoint,
        access_token: String::new(),
        refresh_token: None,
        expires_at: 0,
    };
    login.take(&answer)?;
    let check = Client::new(
        Some(client.server.clone()),
        Some(login.access_token.clone()),
        ca_file,
    )?;
    let me = check
        .get("/v1/me")
        .await
        .context("the server refused the identity provider's token")?;
    let mut settings = json!({"server": client.server, "oidc": login.to_value()});
    if let Some(ca) = ca_file {
        let absolute = ca.canonicalize().unwrap_or_else(|_| ca.to_path_buf());
        settings["caFile"] = json!(absolute.display().to_string());
    }
    let path = crate::client::write_settings(&settings)?;
    eprintln!(
        "logged in to {} as {}; settings saved in {}{}",
        client.server,
        me["subject"].as_str().unwrap_or("?"),
        path.display(),
        if login.refresh_token.is_some() {
            " (the sign-in renews itself)"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Subcommand)]
pub enum ProfileCommand {
    /// Create or replace an auto-upgrade profile (`create` without `--disabled` re-enables one).
    ///
    /// Example: `flotilla autoupgradeprofile create -f retail -n stable --channel Stable
    /// --update-strategy-id /v1/fleets/retail/updateStrategies/safe-rollout`.
    Create {
        #[command(flatten)]
        target: Target,
        /// The auto-upgrade channel: `Rapid` (newest minor), `Stable` (the minor before it),
        /// `TargetKubernetesVersion` (the newest patch of `--target-kubernetes-version`),
        /// `NodeImage` or `SecurityPatch` (node images only).
        #[arg(short = 'c', long, ignore_case = true, value_parser = choice(&["Rapid", "Stable", "TargetKubernetesVersion", "NodeImage", "SecurityPatch"]))]
        channel: String,
        /// The update strategy the generated runs follow, as
        /// `/v1/fleets/FLEET/updateStrategies/NAME` or an Azure resource id ending that way
        /// (default: every member one at a time).
        #[arg(long)]
        update_strategy_id: Option<String>,
        /// How node image versions are chosen: `Latest` (default) or `Consistent` (not with the
        /// NodeImage channel, which is always Consistent).
        #[arg(long, ignore_case = true, value_parser = choice(&["Latest", "Consistent"]))]
        node_image_selection: Option<String>,
        /// With the TargetKubernetesVersion channel (and only with it): the minor version to
        /// follow, `major.minor` (e.g. `1.31`).
        #[arg(long, alias = "tkv")]
        target_kubernetes_version: Option<String>,
        /// Create the profile disabled: it generates no runs until created again without
        /// `--disabled`.
        #[arg(long)]
        disabled: bool,
        /// With the TargetKubernetesVersion channel: allow a minor version that only long-term
        /// support still covers.
        #[arg(long, alias = "lts")]
        long_term_support: bool,
        /// The runs it generates bring members more than one minor behind up one minor at a
        /// time instead of skipping them (not with the NodeImage or SecurityPatch channel).
        #[arg(long)]
        chain_minor_versions: bool,
        /// A release train: trigger only on what this upstream profile validated, as
        /// `/v1/fleets/FLEET/autoUpgradeProfiles/NAME` (same channel; admin only).
        #[arg(long)]
        upstream: Option<String>,
        /// With `--upstream`: how long after the upstream's run completed its target is
        /// promoted here, as seconds or `30m`, `48h`, `7d` (default 7 days).
        #[arg(long, requires = "upstream", value_parser = parse_soak)]
        soak: Option<u64>,
    },
    /// Show an auto-upgrade profile, its last trigger and, for a downstream profile, what its
    /// upstream validated and when it is promoted.
    ///
    /// Example: `flotilla autoupgradeprofile show -f retail -n stable`.
    Show {
        #[command(flatten)]
        target: Target,
    },
    /// List a fleet's auto-upgrade profiles.
    ///
    /// Example: `flotilla autoupgradeprofile list -f retail`.
    List {
        #[command(flatten)]
        fleet: FleetOnly,
    },
    /// Delete an auto-upgrade profile (the runs it created are kept).
    ///
    /// Example: `flotilla autoupgradeprofile delete -f retail -n stable`.
    Delete {
        #[command(flatten)]
        target: Target,
    },
    /// Create (not start) the update run for the profile's current target.
    ///
    /// Example: `flotilla autoupgradeprofile generate-update-run -f retail -n stable`.
    GenerateUpdateRun {
        #[command(flatten)]
        target: Target,
    },
    /// Wait until the profile is created, updated, deleted or a condition holds.
    ///
    /// Example: `flotilla autoupgradeprofile wait -f retail -n rapid --custom "disabled==\`false\`"`.
    Wait {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: WaitFor,
    },
}

const PROFILE_COLUMNS: &[(&str, &[&str])] = &[
    ("name", &["name"]),
    ("channel", &["properties", "channel"]),
    ("target", &["properties", "targetKubernetesVersion"]),
    ("disabled", &["properties", "disabled"]),
    ("strategy", &["properties", "updateStrategyId"]),
    (
        "last trigger",
        &[
            "properties",
            "autoUpgradeProfileStatus",
            "lastTriggerStatus",
        ],
    ),
];

/// Parses `--soak`: seconds, or a number with `s`, `m`, `h` or `d`.
fn parse_soak(text: &str) -> Result<u64, String> {
    let (number, unit) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&text[..i], c.to_ascii_lowercase()),
        _ => (text, 's'),
    };
    let scale = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(format!("{text:?}: the unit must be s, m, h or d")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("{text:?} is not a duration such as 3600, 30m, 48h or 7d"))
}

/// What a downstream profile waits for (SEMANTICS §14), in a sentence.
fn train_standing(profile: &Value) -> String {
    let upstream = s(profile, &["properties", "upstream", "profileId"]);
    let standing = &profile["properties"]["autoUpgradeProfileStatus"]["upstream"];
    if !standing.is_object() {
        return format!("follows {upstream}: nothing validated there yet");
    }
    let target = standing["validatedTarget"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    let ends = s(standing, &["soakEndsAt"]);
    let moved = Time::parse(ends).is_ok_and(|t| t <= flotilla_server::clock::now());
    format!(
        "follows {upstream}: {target} validated by {} at {}; {} {ends}",
        s(standing, &["validatedBy"]),
        s(standing, &["validatedAt"]),
        if moved {
            "promoted when its soak ended at"
        } else {
            "promoted here when its soak ends at"
        }
    )
}

pub async fn profile(
    client: &Client,
    format: Option<Format>,
    command: ProfileCommand,
) -> anyhow::Result<ExitCode> {
    let format = default_format(format);
    let colour = colour_enabled();
    let path = |t: &Target| format!("/v1/fleets/{}/autoUpgradeProfiles/{}", t.fleet, t.name);
    match command {
        ProfileCommand::Create {
            target,
            channel,
            update_strategy_id,
            node_image_selection,
            target_kubernetes_version,
            disabled,
            long_term_support,
            chain_minor_versions,
            upstream,
            soak,
        } => {
            if channel == "NodeImage" && node_image_selection.is_some() {
                bail!("--node-image-selection cannot be used with the NodeImage channel.");
            }
            let mut properties = json!({"channel": channel});
            if let Some(id) = update_strategy_id {
                properties["updateStrategyId"] = json!(id);
            }
            if let Some(sel) = node_image_selection {
                properties["nodeImageSelection"] = json!({"type": sel});
            }
            if let Some(v) = target_kubernetes_version {
                properties["targetKubernetesVersion"] = json!(v);
            }
            if disabled {
                properties["disabled"] = json!(true);
            }
            if long_term_support {
                properties["longTermSupport"] = json!(true);
            }
            if chain_minor_versions {
                properties["chainMinorVersions"] = json!(true);
            }
            if let Some(id) = upstream {
                properties["upstream"] = json!({"profileId": id});
                if let Some(seconds) = soak {
                    properties["upstream"]["soakSeconds"] = json!(seconds);
                }
            }
            let v = client
                .send(
                    reqwest::Method::PUT,
                    &path(&target),
                    Some(&json!({"properties": properties})),
                )
                .await?;
            print(format, &v, || one_row(&v, PROFILE_COLUMNS, colour))?;
            let next = &v["properties"]["autoUpgradeProfileStatus"]["nextTrigger"];
            if let Some(run) = next["updateRunName"].as_str() {
                eprintln!(
                    "will create and start update run {run} ({}) at {} (the server looks every few seconds)",
                    next["upgradeVersions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(", "),
                    s(next, &["triggersAt"])
                );
            } else if v["properties"]["upstream"].is_object() {
                eprintln!("{}", train_standing(&v));
            } else if v["properties"]["disabled"] != json!(true) {
                eprintln!("starts nothing now: no release it would upgrade to is out or announced");
            }
        }
        ProfileCommand::Show { target } => {
            let v = client.get(&path(&target)).await?;
            print(format, &v, || {
                let mut text = one_row(&v, PROFILE_COLUMNS, colour);
                if v["properties"]["upstream"].is_object() {
                    text.push_str(&train_standing(&v));
                    text.push('\n');
                }
                text
            })?;
        }
        ProfileCommand::Wait { target, wait } => {
            let what = format!("auto-upgrade profile {}", target.name);
            return wait_for(client, &path(&target), &what, &wait, never_ends).await;
        }
        ProfileCommand::List { fleet } => {
            let items = client
                .list_all(&format!("/v1/fleets/{}/autoUpgradeProfiles", fleet.fleet))
                .await?;
            print(format, &Value::Array(items.clone()), || {
                resource_rows(&items, PROFILE_COLUMNS, colour)
            })?;
        }
        ProfileCommand::Delete { target } => {
            client
                .send(reqwest::Method::DELETE, &path(&target), None)
                .await?;
            eprintln!("deleted auto-upgrade profile {}", target.name);
        }
        ProfileCommand::GenerateUpdateRun { target } => {
            let v = client
                .send(
                    reqwest::Method::POST,
                    &format!("{}/generateUpdateRun", path(&target)),
                    None,
                )
                .await?;
            print(format, &v, || format!("{}\n", s(&v, &["id"])))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod watch_tests {
    use super::*;

    /// `watch` on a terminal: a line per stage, then gates and waits counting down to when they
    /// open or end, or up from when they began.
    #[test]
    fn gates_and_waits_count_down() {
        let run = json!({"properties": {"status": {"status": {"state": "Running"}, "stages": [
            {"name": "canary", "groups": [{"name": "c", "members": [{"name": "m1", "status": {"state": "Completed"}}]}]},
            {"name": "prod", "groups": [{"name": "p", "members": [{"name": "m2", "status": {"state": "NotStarted"}}]}]}]}}});
        let mut watched = Watched::new(&run, &[]);
        watched.apply(&json!({"type": "WaitStarted", "stage": "canary", "time": "2026-03-02T00:00:00Z", "message": "until 2026-03-02T00:30:00Z"}));
        watched.apply(&json!({"type": "GatePending", "stage": "prod", "gate": "g1", "time": "2026-03-02T00:30:00Z", "message": "Go to production"}));
        watched.apply(&json!({"type": "GatePending", "stage": "prod", "gate": "g2", "time": "2026-03-02T00:30:00Z", "message": "opens at 2026-03-02T02:00:00Z"}));
        let at = |t: &str| Time::parse(t).expect("time");
        let lines = watched.lines(at("2026-03-02T00:20:00Z")).join("\n");
        assert!(
            lines.contains("canary: waiting until 2026-03-02T00:30:00Z (10m 00s left)"),
            "{lines}"
        );
        let lines = watched.lines(at("2026-03-02T00:35:05Z")).join("\n");
        assert!(
            lines.contains("prod: gate g1 waiting: Go to production (for 5m 05s)"),
            "{lines}"
        );
        assert!(
            lines.contains("prod: gate g2 waiting: opens at 2026-03-02T02:00:00Z (1h 24m left)"),
            "{lines}"
        );
        assert!(
            lines.contains("canary: waiting until 2026-03-02T00:30:00Z (due now)"),
            "{lines}"
        );
        watched.apply(&json!({"type": "GateCompleted", "stage": "prod", "gate": "g1"}));
        assert!(
            !watched
                .lines(at("2026-03-02T00:36:00Z"))
                .join("\n")
                .contains("Go to production")
        );
    }

    /// `watch` begins from the run's state, not from its history: a stage already done is a
    /// full bar at once, the gates and waits open then are there with their ids and what their
    /// events said, and an event the first look had already seen moves nothing backwards.
    #[test]
    fn begins_from_the_runs_state_and_never_goes_backwards() {
        let run = json!({"properties": {"status": {"status": {"state": "Running"}, "stages": [
            {"name": "canary", "status": {"state": "Completed"},
             "afterStageWaitStatus": {"status": {"state": "Running", "startTime": "2026-03-02T00:00:00Z"}, "waitDurationInSeconds": 1800},
             "groups": [{"name": "c", "members": [
                {"name": "m1", "status": {"state": "Completed"}},
                {"name": "m3", "status": {"state": "Failed", "error": {"message": "drain timed out"}}}]}]},
            {"name": "prod", "status": {"state": "Pending"},
             "beforeGates": [{"gateId": "g1", "displayName": "Go to production", "status": {"state": "Pending", "startTime": "2026-03-02T00:10:00Z"}}],
             "groups": [{"name": "p",
                "beforeGates": [{"gateId": "g2", "status": {"state": "Pending", "startTime": "2026-03-02T00:10:00Z"}},
                                {"gateId": "g3", "status": {"state": "NotStarted"}}],
                "members": [{"name": "m2", "status": {"state": "NotStarted"}}]}]}]}}});
        let history = [
            json!({"type": "MemberStarted", "stage": "canary", "member": "m1", "time": "2026-03-01T23:50:00Z"}),
            json!({"type": "GatePending", "stage": "prod", "group": "p", "gate": "g2", "time": "2026-03-02T00:10:00Z", "message": "opens at 2026-03-02T02:00:00Z"}),
        ];
        let mut watched = Watched::new(&run, &history);
        let at = |t: &str| Time::parse(t).expect("time");
        let lines = watched.lines(at("2026-03-02T00:20:00Z"));
        assert!(
            lines[0].starts_with("canary") && lines[0].contains("2/2 done, 0 running, 1 failed"),
            "{lines:?}"
        );
        assert!(lines[1].contains("0/1 done"), "{lines:?}");
        let text = lines.join("\n");
        assert!(
            text.contains("prod: gate g1 waiting: Go to production (for 10m 00s)"),
            "{text}"
        );
        assert!(
            text.contains("prod/p: gate g2 waiting: opens at 2026-03-02T02:00:00Z (1h 40m left)"),
            "{text}"
        );
        assert!(
            !text.contains("g3"),
            "a gate not reached is not waiting: {text}"
        );
        assert!(text.contains("canary: waiting (10m 00s left)"), "{text}");
        assert_eq!(
            watched.failures.get("m3").map(String::as_str),
            Some("drain timed out")
        );
        // The stream picks up a moment before the GET: an event it had seen changes nothing.
        watched.apply(&json!({"type": "MemberStarted", "stage": "canary", "member": "m1"}));
        let lines = watched.lines(at("2026-03-02T00:20:00Z"));
        assert!(lines[0].contains("2/2 done, 0 running"), "{lines:?}");
        // A new event moves the run on.
        watched.apply(&json!({"type": "GateCompleted", "stage": "prod", "gate": "g1"}));
        watched.apply(&json!({"type": "MemberStarted", "stage": "prod", "member": "m2"}));
        let text = watched.lines(at("2026-03-02T00:21:00Z")).join("\n");
        assert!(
            !text.contains("g1") && text.contains("0/1 done, 1 running"),
            "{text}"
        );
    }
}
