//! Following one upgrade operation to a definitive answer (API.md, "Driver errors and
//! deadlines"), level-triggered: a transient error is never an answer, so the same question is
//! asked again with backoff until the driver answers or the operation's deadline passes; nothing
//! is sent again while an earlier attempt's state is unknown (the key is polled first); a poll
//! `Unknown` (the driver never received it) observes the cluster, then resends the same key.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_engine::engine::{Input, OperationProgress, Target, cluster_at};
use flotilla_engine::fleet::Cluster;

use crate::clock::{self, Phase};
use crate::{Driver, DriverError, MemberRef, OperationState};

/// Everything the follower reports goes back to the run as an input.
pub trait Report: Send + Sync {
    /// Sends an input to the run; false once the run no longer listens (stopped, abandoned).
    fn input(&self, input: Input, finished_at: Option<Instant>) -> bool;
    /// Whether the run still listens.
    fn listening(&self) -> bool;
}

/// Whether this replica may send to the cluster now: `Some(true)` yes, `Some(false)` not yet
/// (its lease is being renewed), `None` never again under this lease.
pub trait SendPermit: Send + Sync {
    fn may_send(&self) -> Option<bool>;
    /// Records the operation id the driver gave, before the run is told.
    fn record(&self, operation_id: &str) -> impl Future<Output = ()> + Send;
    fn count_started(&self);
}

/// One attempt of one member.
pub struct Attempt {
    pub who: MemberRef,
    pub member: String,
    pub attempt: u64,
    pub target: Target,
    pub key: String,
    /// How long ago the attempt was first recorded (before a restart or a takeover): its
    /// deadline counts from then.
    pub spent: Duration,
}

/// Where the follower starts.
pub enum Begin {
    /// Nothing was sent for this attempt yet.
    Send,
    /// Recorded before a restart or a takeover: maybe sent, maybe not. Ask first.
    Ask,
    /// The driver accepted it under this operation id.
    Follow(String),
}

/// The wait before asking again after `errors` transient errors in a row: from one poll
/// interval, doubling, at most a minute.
pub fn backoff(driver: &dyn Driver, errors: u32) -> Duration {
    let base = driver.poll_interval().max(Duration::from_millis(50));
    base.saturating_mul(1u32 << errors.min(10))
        .min(Duration::from_secs(60))
        .max(base)
}

enum Step {
    Send,
    Ask(String),
    Follow(String),
}

/// Drives an attempt until it ends, then reports `OperationFinished` (with the cluster observed
/// first when it succeeded).
pub async fn drive(
    driver: Arc<dyn Driver>,
    report: impl Report,
    permit: impl SendPermit,
    attempt: Attempt,
    begin: Begin,
) {
    let started = Instant::now()
        .checked_sub(attempt.spent)
        .unwrap_or_else(Instant::now);
    let deadline = driver.operation_deadline();
    let mut errors = 0u32;
    let mut last_error = String::new();
    let mut step = match begin {
        Begin::Send => Step::Send,
        Begin::Ask => Step::Ask(attempt.key.clone()),
        Begin::Follow(id) => Step::Follow(id),
    };
    // At least one question is asked, even when the deadline passed while nobody followed the
    // attempt (a restart): a definitive answer waiting at the driver is still the answer.
    let mut asked = false;
    let outcome: Result<(), String> = loop {
        if !report.listening() {
            return;
        }
        if asked && started.elapsed() > deadline {
            break Err(format!(
                "no definitive answer from the driver within operationDeadlineSeconds ({}s); last error: {last_error}",
                deadline.as_secs()
            ));
        }
        // A transient error: wait, then ask the same question again.
        let transient = |e: &DriverError, errors: &mut u32, last: &mut String| {
            tracing::warn!(member = %attempt.member, attempt = attempt.attempt, error = %e, "driver error; asking again");
            *last = e.message.clone();
            *errors += 1;
            backoff(driver.as_ref(), *errors)
        };
        asked = true;
        match step {
            Step::Send => {
                // Nothing is sent unless this replica's lease is current by its own clock.
                match permit.may_send() {
                    Some(true) => {}
                    Some(false) => {
                        clock::sleep(Duration::from_millis(50), Phase::Driver).await;
                        continue;
                    }
                    None => return,
                }
                match driver
                    .start_upgrade(&attempt.who, &attempt.target, &attempt.key)
                    .await
                {
                    Ok(id) => {
                        permit.count_started();
                        accepted(&report, &permit, &attempt, &id).await;
                        errors = 0;
                        step = Step::Follow(id);
                    }
                    Err(e) if e.is_transient() => {
                        // Whether the driver got it is unknown: ask about the key before
                        // anything is sent again.
                        let wait = transient(&e, &mut errors, &mut last_error);
                        clock::sleep(wait, Phase::Driver).await;
                        step = Step::Ask(attempt.key.clone());
                    }
                    Err(e) => break Err(format!("the upgrade could not be sent: {e}")),
                }
            }
            Step::Ask(ref key) => match driver.poll(&attempt.who, key, &attempt.key).await {
                Ok(OperationState::Unknown) => match resend_or_done(&driver, &attempt).await {
                    Ok(true) => break Ok(()),
                    Ok(false) => step = Step::Send,
                    Err(e) if e.is_transient() => {
                        let wait = transient(&e, &mut errors, &mut last_error);
                        clock::sleep(wait, Phase::Driver).await;
                    }
                    Err(e) => break Err(e.message),
                },
                // A definitive answer is the answer (asking again could meet a driver that has
                // forgotten a finished operation, and resend it).
                Ok(OperationState::Succeeded) => {
                    accepted(&report, &permit, &attempt, key).await;
                    break Ok(());
                }
                Ok(OperationState::Failed(message)) => {
                    accepted(&report, &permit, &attempt, key).await;
                    break Err(message);
                }
                Ok(OperationState::Running) => {
                    let id = key.clone();
                    accepted(&report, &permit, &attempt, &id).await;
                    errors = 0;
                    // Follow it: the next poll gives its state.
                    step = Step::Follow(id);
                }
                Err(e) if e.is_transient() => {
                    let wait = transient(&e, &mut errors, &mut last_error);
                    clock::sleep(wait, Phase::Driver).await;
                }
                Err(e) => break Err(e.message),
            },
            Step::Follow(ref id) => {
                let wait = if errors == 0 {
                    driver.poll_after(id)
                } else {
                    backoff(driver.as_ref(), errors)
                };
                clock::sleep(wait, Phase::Driver).await;
                if !report.listening() {
                    return;
                }
                match driver.poll(&attempt.who, id, &attempt.key).await {
                    Ok(OperationState::Running) => errors = 0,
                    Ok(OperationState::Succeeded) => break Ok(()),
                    Ok(OperationState::Failed(message)) => break Err(message),
                    Ok(OperationState::Unknown) => {
                        // The driver never received it (or forgot it): observe, then send the
                        // same key again unless the cluster is already at its target.
                        match resend_or_done(&driver, &attempt).await {
                            Ok(true) => break Ok(()),
                            Ok(false) => step = Step::Send,
                            Err(e) if e.is_transient() => {
                                last_error = e.message.clone();
                                errors += 1;
                            }
                            Err(e) => break Err(e.message),
                        }
                    }
                    Err(e) if e.is_transient() => {
                        last_error = e.message.clone();
                        errors += 1;
                        tracing::warn!(member = %attempt.member, attempt = attempt.attempt, error = %e, "polling the upgrade failed; asking again");
                    }
                    Err(e) => break Err(e.message),
                }
            }
        }
    };
    let finished_at = Instant::now();
    if outcome.is_ok() {
        // The run records the cluster as it is now; a failing observation is asked again a few
        // times, and the result is reported either way (the engine applies the target).
        for tries in 0..5 {
            match observe(&driver, &attempt.who).await {
                Ok(cluster) => {
                    report.input(
                        Input::Observed {
                            member: attempt.member.clone(),
                            cluster: std::sync::Arc::new(cluster),
                            operation: None,
                        },
                        None,
                    );
                    break;
                }
                Err(e) if e.is_transient() && tries < 4 => {
                    clock::sleep(backoff(driver.as_ref(), tries + 1), Phase::Driver).await;
                }
                Err(_) => break,
            }
        }
    }
    report.input(
        Input::OperationFinished {
            member: attempt.member,
            attempt: attempt.attempt,
            outcome,
        },
        Some(finished_at),
    );
}

/// The driver has the attempt under `id`: recorded in the store, then told to the run.
async fn accepted(report: &impl Report, permit: &impl SendPermit, attempt: &Attempt, id: &str) {
    permit.record(id).await;
    report.input(
        Input::OperationAccepted {
            member: attempt.member.clone(),
            attempt: attempt.attempt,
            operation_id: id.to_string(),
        },
        None,
    );
}

/// Before a resend after `Unknown`: the cluster is observed again (API.md); at its target,
/// the attempt is done.
async fn resend_or_done(driver: &Arc<dyn Driver>, attempt: &Attempt) -> Result<bool, DriverError> {
    let cluster = observe(driver, &attempt.who).await?;
    Ok(cluster_at(&cluster, &attempt.target))
}

async fn observe(driver: &Arc<dyn Driver>, who: &MemberRef) -> Result<Cluster, DriverError> {
    let spec = driver.observe(who).await?;
    Cluster::parse(&spec, "cluster")
        .map_err(|e| DriverError::transient(format!("observe: {}", e.message)))
}

/// What re-attaching after a stop found.
pub enum Reattached {
    /// Both answered: whether the earlier operation still runs, and the cluster.
    Answered(OperationProgress, Cluster),
    /// A permanent error, or no answer within the operation's deadline: the member fails with
    /// this message.
    GaveUp(String),
    /// The run stopped listening.
    Gone,
}

/// After a stop and start: asks whether the earlier operation still runs and where the cluster
/// is, until both are answered; a transient error is never read as "not running".
pub async fn reattach(
    driver: &Arc<dyn Driver>,
    report: &impl Report,
    who: &MemberRef,
    operation: &str,
    key: &str,
) -> Reattached {
    let started = Instant::now();
    let deadline = driver.operation_deadline();
    let mut errors = 0;
    let give_up = |e: &DriverError, started: Instant| {
        if !e.is_transient() {
            Some(e.message.clone())
        } else if started.elapsed() > deadline {
            Some(format!(
                "no answer from the driver within operationDeadlineSeconds ({}s) after the run started again; last error: {e}",
                deadline.as_secs()
            ))
        } else {
            None
        }
    };
    let progress = loop {
        if !report.listening() {
            return Reattached::Gone;
        }
        match driver.poll(who, operation, key).await {
            Ok(OperationState::Running) => break OperationProgress::InProgress,
            Ok(_) => break OperationProgress::NotRunning,
            Err(e) => {
                if let Some(why) = give_up(&e, started) {
                    return Reattached::GaveUp(why);
                }
                errors += 1;
                tracing::warn!(member = %who.name, error = %e, "cannot ask about the earlier operation; asking again");
                clock::sleep(backoff(driver.as_ref(), errors), Phase::Driver).await;
            }
        }
    };
    loop {
        if !report.listening() {
            return Reattached::Gone;
        }
        match observe(driver, who).await {
            Ok(cluster) => return Reattached::Answered(progress, cluster),
            Err(e) => {
                if let Some(why) = give_up(&e, started) {
                    return Reattached::GaveUp(why);
                }
                errors += 1;
                tracing::warn!(member = %who.name, error = %e, "cannot observe the cluster; asking again");
                clock::sleep(backoff(driver.as_ref(), errors), Phase::Driver).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use async_trait::async_trait;
    use flotilla_engine::fleet::{Catalog, ClusterSpec};
    use flotilla_engine::strategy::UpgradeType;
    use flotilla_engine::version::KubeVersion;

    use super::*;

    /// A driver whose answers are scripted call by call; it records every send.
    struct Scripted {
        polls: Mutex<VecDeque<Result<OperationState, DriverError>>>,
        starts: Mutex<VecDeque<Result<String, DriverError>>>,
        sent: Mutex<Vec<String>>,
        version: &'static str,
        deadline: Duration,
    }

    #[async_trait]
    impl Driver for Scripted {
        async fn observe(&self, _: &MemberRef) -> Result<ClusterSpec, DriverError> {
            Ok(serde_json::from_value(serde_json::json!({
                "region": "eastus", "kubernetesVersion": self.version
            }))
            .expect("valid"))
        }
        async fn start_upgrade(
            &self,
            _: &MemberRef,
            _: &Target,
            key: &str,
        ) -> Result<String, DriverError> {
            self.sent.lock().unwrap().push(key.to_string());
            self.starts
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Ok(key.to_string()))
        }
        async fn poll(
            &self,
            _: &MemberRef,
            _: &str,
            _: &str,
        ) -> Result<OperationState, DriverError> {
            let mut polls = self.polls.lock().unwrap();
            match polls.len() {
                0 => Err(DriverError::transient("poll.sh: exited with code 1")),
                1 => polls.front().cloned().expect("one"),
                _ => polls.pop_front().expect("some"),
            }
        }
        async fn catalog(&self) -> Result<Catalog, DriverError> {
            Ok(Catalog::default())
        }
        fn poll_interval(&self) -> Duration {
            Duration::from_millis(1)
        }
        fn operation_deadline(&self) -> Duration {
            self.deadline
        }
    }

    #[derive(Default)]
    struct Collect(Mutex<Vec<Input>>);
    impl Report for &Collect {
        fn input(&self, input: Input, _: Option<Instant>) -> bool {
            self.0.lock().unwrap().push(input);
            true
        }
        fn listening(&self) -> bool {
            true
        }
    }

    struct Always;
    impl SendPermit for Always {
        fn may_send(&self) -> Option<bool> {
            Some(true)
        }
        async fn record(&self, _: &str) {}
        fn count_started(&self) {}
    }

    fn scripted(
        starts: Vec<Result<String, DriverError>>,
        polls: Vec<Result<OperationState, DriverError>>,
    ) -> Arc<Scripted> {
        Arc::new(Scripted {
            polls: Mutex::new(polls.into()),
            starts: Mutex::new(starts.into()),
            sent: Mutex::new(Vec::new()),
            version: "1.30.5",
            deadline: Duration::from_secs(60),
        })
    }

    async fn run(driver: Arc<Scripted>, begin: Begin) -> (Vec<Input>, Vec<String>) {
        run_spent(driver, begin, Duration::ZERO).await
    }

    /// Follows an attempt first recorded `spent` ago (before a restart).
    async fn run_spent(
        driver: Arc<Scripted>,
        begin: Begin,
        spent: Duration,
    ) -> (Vec<Input>, Vec<String>) {
        let collect = Collect::default();
        let attempt = Attempt {
            who: MemberRef {
                name: "m1".into(),
                cluster_resource_id: "m1".into(),
            },
            member: "m1".into(),
            spent,
            attempt: 1,
            target: Target {
                rollback: None,
                upgrade_type: UpgradeType::ControlPlaneOnly,
                kubernetes_version: Some(KubeVersion::parse("1.31.1").expect("valid")),
                node_images: vec![],
            },
            key: "f.r.1".into(),
        };
        drive(driver.clone(), &collect, Always, attempt, begin).await;
        let sent = driver.sent.lock().unwrap().clone();
        (collect.0.into_inner().unwrap(), sent)
    }

    fn outcome(inputs: &[Input]) -> Result<(), String> {
        match inputs.last() {
            Some(Input::OperationFinished { outcome, .. }) => outcome.clone(),
            other => panic!("no result: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_lost_answer_to_a_send_is_asked_about_before_anything_is_sent_again() {
        let transient = DriverError::transient("upgrade.sh: exited with code 1");
        let driver = scripted(
            vec![Err(transient)],
            vec![
                Ok(OperationState::Running),
                Ok(OperationState::Running),
                Ok(OperationState::Succeeded),
            ],
        );
        let (inputs, sent) = run(driver, Begin::Send).await;
        assert_eq!(sent, vec!["f.r.1"], "sent once");
        assert_eq!(outcome(&inputs), Ok(()));
    }

    #[tokio::test]
    async fn transient_poll_errors_are_asked_again_and_never_fail_the_member() {
        let flaky = || Err(DriverError::transient("poll.sh: timed out after 1s"));
        let driver = scripted(
            vec![],
            vec![
                flaky(),
                flaky(),
                flaky(),
                flaky(),
                Ok(OperationState::Succeeded),
            ],
        );
        let (inputs, sent) = run(driver, Begin::Send).await;
        assert_eq!(sent.len(), 1);
        assert_eq!(outcome(&inputs), Ok(()));
        assert!(
            inputs.iter().any(|i| matches!(
                i,
                Input::Observed {
                    operation: None,
                    ..
                }
            )),
            "the cluster is observed after a success"
        );
    }

    #[tokio::test]
    async fn unknown_observes_then_resends_the_same_key() {
        let driver = scripted(
            vec![],
            vec![Ok(OperationState::Unknown), Ok(OperationState::Succeeded)],
        );
        let (inputs, sent) = run(driver, Begin::Send).await;
        assert_eq!(sent, vec!["f.r.1", "f.r.1"]);
        assert_eq!(outcome(&inputs), Ok(()));
    }

    #[tokio::test]
    async fn a_recorded_attempt_is_asked_about_and_not_resent_while_the_answer_is_unknown() {
        let flaky = || Err(DriverError::transient("poll.sh: exited with code 1"));
        let driver = scripted(
            vec![],
            vec![
                flaky(),
                flaky(),
                Ok(OperationState::Running),
                Ok(OperationState::Succeeded),
            ],
        );
        let (inputs, sent) = run(driver, Begin::Ask).await;
        assert!(sent.is_empty(), "nothing sent: {sent:?}");
        assert_eq!(outcome(&inputs), Ok(()));
    }

    #[tokio::test]
    async fn reattaching_gives_up_on_a_permanent_error_instead_of_holding_the_slot() {
        let driver: Arc<dyn Driver> = scripted(
            vec![],
            vec![Err(DriverError::permanent("poll: the cluster was deleted"))],
        );
        let collect = Collect::default();
        let who = MemberRef {
            name: "m1".into(),
            cluster_resource_id: "m1".into(),
        };
        match reattach(&driver, &&collect, &who, "f.r.1", "f.r.1").await {
            Reattached::GaveUp(why) => assert!(why.contains("deleted"), "{why}"),
            _ => panic!("expected to give up"),
        }
    }

    #[tokio::test]
    async fn a_permanent_error_fails_at_once() {
        let driver = scripted(
            vec![],
            vec![Err(DriverError::permanent("poll: the cluster was deleted"))],
        );
        let (inputs, _) = run(driver, Begin::Send).await;
        assert_eq!(
            outcome(&inputs),
            Err("poll: the cluster was deleted".into())
        );
    }

    #[tokio::test]
    async fn only_the_deadline_gives_up_and_then_with_the_last_error() {
        let driver = Arc::new(Scripted {
            polls: Mutex::new(VecDeque::new()),
            starts: Mutex::new(VecDeque::new()),
            sent: Mutex::new(Vec::new()),
            version: "1.30.5",
            deadline: Duration::from_millis(300),
        });
        let (inputs, sent) = run(driver, Begin::Send).await;
        assert_eq!(sent.len(), 1);
        let error = outcome(&inputs).expect_err("given up");
        assert!(
            error.contains("operationDeadlineSeconds") && error.contains("exited with code 1"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn the_deadline_counts_from_the_first_send_across_a_restart() {
        let scripted = |polls: Vec<Result<OperationState, DriverError>>| {
            Arc::new(Scripted {
                polls: Mutex::new(polls.into()),
                starts: Mutex::new(VecDeque::new()),
                sent: Mutex::new(Vec::new()),
                version: "1.30.5",
                deadline: Duration::from_secs(3600),
            })
        };
        // Recorded two hours ago with a one-hour deadline: asked once; an error then ends it,
        // and nothing is sent again.
        let (inputs, sent) =
            run_spent(scripted(vec![]), Begin::Ask, Duration::from_secs(7200)).await;
        assert!(sent.is_empty(), "{sent:?}");
        let error = outcome(&inputs).expect_err("given up");
        assert!(
            error.contains("operationDeadlineSeconds") && error.contains("exited with code 1"),
            "{error}"
        );
        // The same, but the driver has the answer: it is the answer.
        let (inputs, sent) = run_spent(
            scripted(vec![Ok(OperationState::Succeeded)]),
            Begin::Ask,
            Duration::from_secs(7200),
        )
        .await;
        assert!(sent.is_empty(), "{sent:?}");
        assert_eq!(outcome(&inputs), Ok(()));
    }
}
