//! The update run's read-only status tree and event log, in the API's JSON shape
//! (`fleet-api-reference.md` §1.2, conformance README "Result document").

use serde::{Deserialize, Serialize};

use crate::time::Time;

/// `UpdateState`, at every level of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum State {
    NotStarted,
    Pending,
    Running,
    Stopping,
    Stopped,
    Skipped,
    Failed,
    Completed,
}

impl State {
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Skipped | State::Failed | State::Completed)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_time: Option<Time>,
    pub state: State,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    pub gate_id: String,
    pub status: UpdateStatus,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitStatus {
    pub status: UpdateStatus,
    pub wait_duration_in_seconds: i64,
    /// When a started wait ends, where that is not its start plus `waitDurationInSeconds`: on
    /// a fleet whose simulated clock runs faster than real time (the `sim` driver's
    /// `timeScale`), waits are scaled like upgrades.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<Time>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    pub status: UpdateStatus,
    pub name: String,
    pub cluster_resource_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What a Pending member waits for, beside its message (API.md): the kind, the name of the
    /// run, freeze or budget where there is one, and until when where that is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<WaitingFor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_checks: Vec<CheckResult>,
    /// In a run with `chainMinorVersions` (SEMANTICS §13): every hop sent to the member in
    /// this run, retries included, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hops: Vec<Hop>,
    /// What its cluster was just before the run's first operation on it (SEMANTICS §15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<crate::engine::Before>,
    /// Whether it was rolled back, where a rollback was due (SEMANTICS §15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back: Option<bool>,
}

/// One hop of a chained minor upgrade (SEMANTICS §13): one driver operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hop {
    pub from: crate::version::KubeVersion,
    pub to: crate::version::KubeVersion,
    pub start_time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_time: Option<Time>,
    /// Running, then Completed or Failed; Stopped while its run is stopped.
    pub state: State,
}

/// Why a Pending member cannot start yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingFor {
    pub kind: crate::engine::WaitReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
}

/// One evaluation of a check as a status shows it (SEMANTICS §10): the latest of each check
/// and every failing one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub name: String,
    pub time: Time,
    /// What was seen; `None` when the evaluation could not be made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `None` when the evaluation could not be made.
    pub passed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupStatus {
    pub status: UpdateStatus,
    pub name: String,
    pub failure_count: u64,
    pub max_allowed_failures: u64,
    pub max_concurrency: u64,
    pub members: Vec<MemberStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before_gates: Vec<GateStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_gates: Vec<GateStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_checks: Vec<CheckResult>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    pub status: UpdateStatus,
    pub name: String,
    pub failure_count: u64,
    pub max_allowed_failures: u64,
    pub max_concurrency: u64,
    pub groups: Vec<GroupStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before_gates: Vec<GateStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_gates: Vec<GateStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_stage_wait_status: Option<WaitStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_checks: Vec<CheckResult>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectedNodeImageVersion {
    /// `<family>-<version>`, as AKS writes node images.
    pub version: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeImageSelectionStatus {
    pub selected_node_image_versions: Vec<SelectedNodeImageVersion>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateRunStatus {
    pub status: UpdateStatus,
    pub stages: Vec<StageStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_image_selection: Option<NodeImageSelectionStatus>,
    pub failure_count: u64,
    /// When a moving run is predicted to end (SEMANTICS §11): the shell's, never the engine's
    /// (a forecast is computed off the fleet's actor and never journaled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<RunForecast>,
    /// What the run's creation warned of: a target no catalog can vouch for, thresholds that
    /// tolerate every member failing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// A rollback run: the run it rolls back (SEMANTICS §15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_of: Option<String>,
    /// The rollback run of this run (SEMANTICS §15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back_by: Option<String>,
    /// A run a downstream profile generated from what its upstream validated (SEMANTICS §14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_from: Option<PromotedFrom>,
    /// A Completed run: what it left its members on, and whether that validates its target for
    /// a downstream profile (SEMANTICS §14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_on: Option<EndedOn>,
}

/// Where a promoted run's target comes from (SEMANTICS §14): the upstream run that validated
/// it, and when that run completed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromotedFrom {
    pub run_id: String,
    pub completed_time: Time,
    /// Whether the node images are pinned to the upstream's; `false` where the fleet's driver
    /// cannot pin them (the Kubernetes version still is).
    pub images_pinned: bool,
}

/// What a Completed run left its members on (SEMANTICS §14).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndedOn {
    /// The run's Kubernetes target, where its upgrade had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<crate::version::KubeVersion>,
    /// Per image family, the oldest node image its members' pools ended on (runs that upgrade
    /// node images only), as `<family>-<version>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_image_versions: Vec<SelectedNodeImageVersion>,
    /// Whether the run validates its target: no member failed, nothing skipped by a user, and
    /// at least one member upgraded by an operation.
    pub validates: bool,
    /// Why it does not validate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A running run's forecast as its status shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunForecast {
    /// `None`: it does not end within a year, as far as the forecast can tell.
    pub completed_time: Option<Time>,
    pub computed_at: Time,
}

/// What happened, in order. Types are those of the conformance README.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventType {
    RunStarted,
    RunStopped,
    RunCompleted,
    RunFailed,
    RunSkipped,
    StageStarted,
    StageCompleted,
    StageFailed,
    StageSkipped,
    StageStopped,
    GroupStarted,
    GroupCompleted,
    GroupFailed,
    GroupSkipped,
    GroupStopped,
    GatePending,
    GateCompleted,
    GateSkipped,
    /// A HealthCheck gate's checks failed (SEMANTICS §10).
    GateFailed,
    WaitStarted,
    WaitCompleted,
    WaitSkipped,
    MemberPending,
    MemberStarted,
    MemberReattached,
    MemberSucceeded,
    MemberFailed,
    MemberSkipped,
    MemberStopped,
    /// A member's upgrade succeeded and its soak began (SEMANTICS §10).
    MemberVerifying,
    /// One hop of a chained minor upgrade was sent (SEMANTICS §13).
    MemberHopStarted,
    MemberHopSucceeded,
    MemberHopFailed,
    /// One rollback step of a member was sent (SEMANTICS §15).
    MemberRollingBack,
    /// A member is back at its state before the run (SEMANTICS §15).
    MemberRolledBack,
    /// A rollback run of this run was created (SEMANTICS §15).
    RollbackRunCreated,
    /// One evaluation of a health or readiness check.
    HealthCheckEvaluated,
    ActionRejected,
    /// A fleet's freeze was created, changed or deleted (SEMANTICS §12): a fleet's event, in no
    /// run's log, sent to webhooks.
    FreezeChanged,
    /// A fleet's disruption budget was created, changed or deleted (SEMANTICS §12).
    DisruptionBudgetChanged,
    /// A downstream profile's upstream validated a target: it promotes when the soak ends
    /// (SEMANTICS §14). A fleet's event, in no run's log.
    PromotionScheduled,
    /// A downstream profile created and started its promoted run (SEMANTICS §14).
    PromotionStarted,
}

impl EventType {
    /// Every event type, in the order of the enum: what a client matches a name against (the
    /// CLI's `--events`, in any case).
    pub const ALL: [EventType; 42] = [
        EventType::RunStarted,
        EventType::RunStopped,
        EventType::RunCompleted,
        EventType::RunFailed,
        EventType::RunSkipped,
        EventType::StageStarted,
        EventType::StageCompleted,
        EventType::StageFailed,
        EventType::StageSkipped,
        EventType::StageStopped,
        EventType::GroupStarted,
        EventType::GroupCompleted,
        EventType::GroupFailed,
        EventType::GroupSkipped,
        EventType::GroupStopped,
        EventType::GatePending,
        EventType::GateCompleted,
        EventType::GateSkipped,
        EventType::GateFailed,
        EventType::WaitStarted,
        EventType::WaitCompleted,
        EventType::WaitSkipped,
        EventType::MemberPending,
        EventType::MemberStarted,
        EventType::MemberReattached,
        EventType::MemberSucceeded,
        EventType::MemberFailed,
        EventType::MemberSkipped,
        EventType::MemberStopped,
        EventType::MemberVerifying,
        EventType::MemberHopStarted,
        EventType::MemberHopSucceeded,
        EventType::MemberHopFailed,
        EventType::MemberRollingBack,
        EventType::MemberRolledBack,
        EventType::RollbackRunCreated,
        EventType::HealthCheckEvaluated,
        EventType::ActionRejected,
        EventType::FreezeChanged,
        EventType::DisruptionBudgetChanged,
        EventType::PromotionScheduled,
        EventType::PromotionStarted,
    ];
}

#[cfg(test)]
mod event_type_tests {
    use super::EventType;

    /// `ALL` is every variant: serde's list of the names it reads, which the derive keeps.
    #[test]
    fn all_lists_every_event_type() {
        let e = serde_json::from_value::<EventType>(serde_json::json!("NoSuchEvent"))
            .expect_err("not an event type");
        let message = e.to_string();
        let listed: Vec<&str> = message
            .split("expected one of ")
            .nth(1)
            .expect("serde lists the variants")
            .split(", ")
            .map(|v| v.trim_matches('`'))
            .collect();
        let all: Vec<String> = EventType::ALL.iter().map(|t| format!("{t:?}")).collect();
        assert_eq!(listed, all);
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub time: Time,
    #[serde(rename = "type")]
    pub kind: EventType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::error::ApiError>,
}

impl Event {
    /// A user action that was refused, with the error the API would have answered.
    pub fn rejected(time: Time, action: &str, error: crate::error::ApiError) -> Event {
        Event {
            time,
            kind: EventType::ActionRejected,
            stage: None,
            group: None,
            member: None,
            gate: None,
            message: Some(action.to_string()),
            error: Some(error),
        }
    }
}
