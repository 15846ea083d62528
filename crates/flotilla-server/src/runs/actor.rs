//! A fleet's task (its actor): the fleet engine and the runs it drives, every input and action through one queue, each step persisted as one batch before its commands go out.

use super::*;

/// Tells the fleet engine of each freeze and budget that is new, changed or gone (SEMANTICS
/// §12); whether any was.
pub(super) fn apply_rules(
    engine: &mut FleetEngine,
    now: Time,
    rules: crate::fleet_rules::Rules,
) -> bool {
    let crate::fleet_rules::Rules { freezes, budgets } = rules;
    let held: Vec<_> = engine.budgets().cloned().collect();
    let mut inputs = differences(
        &held,
        budgets,
        |b| &b.name,
        |name| FleetInput::DeleteBudget { name },
        |b| FleetInput::PutBudget(Box::new(b)),
    );
    let held: Vec<_> = engine.freezes().cloned().collect();
    inputs.extend(differences(
        &held,
        freezes,
        |f| &f.name,
        |name| FleetInput::DeleteFreeze { name },
        |f| FleetInput::PutFreeze(Box::new(f)),
    ));
    let changed = !inputs.is_empty();
    for input in inputs {
        let _ = engine.handle(now, input);
    }
    changed
}

/// What turns the rules `held` into `stored`: a deletion for each one gone, a put for each one
/// new or changed.
fn differences<T: PartialEq>(
    held: &[T],
    stored: Vec<T>,
    name: impl Fn(&T) -> &String,
    delete: impl Fn(String) -> FleetInput,
    put: impl Fn(T) -> FleetInput,
) -> Vec<FleetInput> {
    let mut inputs: Vec<FleetInput> = held
        .iter()
        .filter(|h| !stored.iter().any(|s| name(s) == name(h)))
        .map(|h| delete(name(h).clone()))
        .collect();
    inputs.extend(stored.into_iter().filter(|s| !held.contains(s)).map(put));
    inputs
}

/// How often a fleet's moving runs are forecast for their statuses, at most (SEMANTICS §11).
pub(super) const FORECAST_EVERY: Duration = Duration::from_secs(60);

/// When a fleet's moving runs are next forecast for their statuses.
#[derive(Default)]
pub(super) struct ForecastPace {
    /// Something that moves the forecast happened since it was last made.
    pub(super) dirty: bool,
    /// One is being made now.
    pub(super) running: bool,
    pub(super) last: Option<Instant>,
}

impl ForecastPace {
    /// When the next forecast is due, if one is.
    pub(super) fn due(&self) -> Option<Instant> {
        if !self.dirty || self.running {
            return None;
        }
        Some(self.last.map_or_else(Instant::now, |t| t + FORECAST_EVERY))
    }
}

/// Whether a run moves by itself (a forecast of its end means something): started, and neither
/// stopped nor ended.
pub(super) fn moving(engine: &Engine) -> bool {
    !engine.is_finished() && !matches!(engine.state(), State::NotStarted | State::Stopped)
}

/// Where the answer to a user action goes.
pub(super) type Reply = oneshot::Sender<Result<(), Refusal>>;

/// What the fleet's task keeps for each run it drives, beside the run's engine.
pub(super) struct RunMeta {
    /// The run resource without its status.
    pub(super) base: Value,
    /// The run's end as last forecast, shown in its status while it moves.
    pub(super) forecast: Option<RunForecast>,
    /// Where the status sits in the run's document, found at the first status write.
    pub(super) around: Option<StatusPlace>,
    /// Attempt → operation id, once the driver named it.
    pub(super) operations: HashMap<u64, String>,
    /// Attempts a driver task is still following.
    pub(super) outstanding: std::collections::HashSet<u64>,
    /// The status changed since it was last written.
    pub(super) status_dirty: bool,
    /// Tells whether what a reader sees of the run changed.
    pub(super) status: StatusChanges,
    pub(super) last_status_write: Option<Instant>,
    /// The size of the run's document as last written, in bytes: what a reader of each new
    /// version of it puts together and sends.
    pub(super) status_bytes: usize,
    /// Each chunk of the run's members ([`Engine::status_chunks`]) at its revision and size
    /// when last written; empty until the task first writes them all.
    pub(super) chunks_written: Vec<(u64, usize)>,
    /// The eTag of the run's snapshot when it was loaded: a batch is written only while it is
    /// the same, so a run replaced or deleted (through any replica) stops being driven.
    pub(super) snapshot_etag: String,
    /// Log entries of steps that showed nothing, written with the run's next batch; held as the
    /// engine was given them (a cluster is a shared pointer, not a JSON tree) until written.
    pub(super) unwritten: Vec<Delivered>,
    /// What the log written since the run's last checkpoint costs to replay ([`log_cost`]),
    /// and that checkpoint's size.
    pub(super) log_cost: u64,
    pub(super) checkpoint_bytes: u64,
    /// When the run was loaded: a finished run loaded for an action (a retry of a Failed run)
    /// stays until the action, which comes in the next message, has been applied.
    pub(super) loaded_at: Instant,
}

/// How long a finished run loaded for an action is kept loaded at least.
pub(super) const LOADED_KEPT: Duration = Duration::from_secs(10);

impl RunMeta {
    /// Counts log entries written, and whether the run is due a checkpoint after them.
    pub(super) fn checkpoint_due(&mut self, entries: &[String], after: u64) -> bool {
        self.log_cost += log_cost(entries);
        !entries.is_empty() && self.log_cost >= after.max(self.checkpoint_bytes)
    }

    /// How often a status nobody waits for is written: [`STATUS_EVERY`] per started MiB of the
    /// document. A write stores only what changed, but every reader of a new version reads the
    /// whole document (the answer cache keeps one version), so the pace follows its size.
    pub(super) fn status_every(&self) -> Duration {
        // On a virtual clock every instant's statuses are written before it moves on.
        if crate::clock::is_virtual() {
            return Duration::ZERO;
        }
        let mib = u32::try_from(self.status_bytes >> 20).unwrap_or(u32::MAX);
        STATUS_EVERY.saturating_mul(mib.saturating_add(1))
    }
}

/// What one step did to one run, to be written in the run's batch.
#[derive(Default)]
pub(super) struct RunStep {
    pub(super) replies: Vec<(Reply, Result<(), ApiError>)>,
    pub(super) durations: Vec<UpgradeDuration>,
    pub(super) action_results: Vec<(i64, Value)>,
    pub(super) finished_attempts: Vec<u64>,
    pub(super) intents: Vec<Intent>,
    pub(super) commands: Vec<Command>,
    pub(super) events: Vec<Value>,
    pub(super) gates_changed: bool,
    pub(super) structural: bool,
}

/// The task that drives every run of one fleet: it owns the fleet's [`FleetEngine`], so the
/// rules between runs (one operation per cluster) are the engine's, decided in one place.
pub(super) struct FleetActor {
    pub(super) fleet: String,
    pub(super) engine: FleetEngine,
    pub(super) meta: HashMap<String, RunMeta>,
    pub(super) runs: Arc<Runs>,
    pub(super) driver: Arc<dyn Driver>,
    pub(super) tx: Inbox,
    /// The fleet lease this task drives under; every batch is written under it.
    pub(super) fence: Fence,
    /// The runs driven now, as the API sees them.
    pub(super) driving: Arc<Mutex<std::collections::HashSet<String>>>,
    /// When the moving runs' statuses get their next forecast.
    pub(super) pace: ForecastPace,
}

impl FleetActor {
    pub(super) fn member_ref(&self, run: &str, name: &str) -> MemberRef {
        MemberRef {
            name: name.to_string(),
            cluster_resource_id: self
                .engine
                .run(run)
                .and_then(|e| e.cluster_resource_id(name))
                .unwrap_or_default()
                .to_string(),
        }
    }

    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<(Msg, Busy)>) {
        // A status left to write keeps a virtual clock where it is until it is written.
        let mut unwritten: Option<Busy> = None;
        // What the last step worked on behalf of: given up once the next timer is set.
        let mut done: Vec<Busy> = Vec::new();
        loop {
            let mut woke_at = None;
            let engine_wakeup = self.engine.next_wakeup();
            // When the engine's timer is due on this process's clock, for the starts it makes
            // possible (the `timer` trigger's latency).
            let engine_due = engine_wakeup.map(|at| {
                let wait = at.unix().saturating_mul(1000) - crate::clock::now_millis();
                Instant::now() + Duration::from_millis(wait.max(0) as u64)
            });
            let engine_timer = engine_wakeup.map(|at| crate::clock::sleep_until(at, Phase::Engine));
            let engine_timer = async move {
                match engine_timer {
                    Some(timer) => timer.await,
                    None => std::future::pending().await,
                }
            };
            done.clear();
            // A status left unwritten by a busy step is written at the latest this much later.
            let flush_deadline = self
                .meta
                .values()
                .filter(|m| m.status_dirty)
                .map(|m| {
                    m.last_status_write
                        .map_or_else(Instant::now, |t| t + m.status_every())
                })
                .min();
            let deadline = [flush_deadline, self.pace.due()]
                .into_iter()
                .flatten()
                .min();
            let other_timer = async move {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                    None => std::future::pending().await,
                }
            };
            // What this step works on behalf of: its messages, or the timer that woke it.
            let mut held: Vec<Busy> = Vec::new();
            let first = tokio::select! {
                m = rx.recv() => match m {
                    Some((m, busy)) => {
                        held.push(busy);
                        Some(m)
                    }
                    None => break,
                },
                busy = engine_timer => {
                    held.push(busy);
                    woke_at = engine_due;
                    None
                }
                _ = other_timer => None,
            };
            let mut batch: Vec<Msg> = first.into_iter().collect();
            loop {
                while let Ok((m, busy)) = rx.try_recv() {
                    held.push(busy);
                    batch.push(m);
                }
                // On a virtual clock, all that reaches the fleet at one instant is one batch.
                if !crate::clock::others_at_work(held.len()).await {
                    break;
                }
            }
            if !self.step(batch, woke_at).await {
                break;
            }
            self.forecast_if_due();
            unwritten = if self.meta.values().any(|m| m.status_dirty) {
                unwritten.or_else(|| Some(crate::clock::busy()))
            } else {
                None
            };
            done = held;
        }
        drop((done, unwritten));
        if let Ok(mut driving) = self.driving.lock() {
            driving.clear();
        }
        // Whatever was queued is answered or handed over again, never silently dropped.
        rx.close();
        while let Ok((msg, _busy)) = rx.try_recv() {
            self.turn_away(msg);
        }
    }

    /// Answers a message this task will not carry out: an action is refused, a handed-over
    /// action is handed over again.
    pub(super) fn turn_away(&self, msg: Msg) {
        match msg {
            Msg::Action { reply, .. } => {
                let _ = reply.send(Err(Refusal::Api(ApiError::conflict(
                    "the fleet's reconciler stopped; try again",
                ))));
            }
            Msg::Adopt { reply, .. } => {
                let _ = reply.send(Err(ApiError::conflict(
                    "the fleet's reconciler stopped; try again",
                )));
            }
            Msg::Remote { id, .. } => self.runs.undeliver(&self.fleet, id),
            Msg::RollBack { answer, .. } => self.refuse(
                answer,
                Refusal::Api(ApiError::conflict(
                    "the fleet's reconciler stopped; try again",
                )),
            ),
            _ => {}
        }
    }

    /// Answers an action that was not carried out: a handed-over one is handed over again.
    fn refuse(&self, answer: Answer, why: Refusal) {
        match answer {
            Answer::Caller(reply) => {
                let _ = reply.send(Err(why));
            }
            Answer::Remote(id) => self.runs.undeliver(&self.fleet, id),
        }
    }

    /// Takes in a run loaded from the store and re-asks the driver about everything it had in
    /// flight when it was last written.
    pub(super) fn adopt(&mut self, run: String, loaded: LoadedRun) -> Result<(), ApiError> {
        if self.meta.contains_key(&run) {
            return Ok(());
        }
        self.engine.adopt_run(now(), &run, loaded.engine)?;
        self.drive(
            &run,
            loaded.base,
            loaded.snapshot_etag,
            (loaded.log_cost, loaded.checkpoint_bytes),
            false,
        );
        let Some(engine) = self.engine.run(&run) else {
            return Ok(());
        };
        let pending = engine.pending_observations();
        let mut follow = Vec::new();
        for intent in loaded.intents.into_iter().filter(|i| !i.finished) {
            if engine.member_attempt(&intent.member) != Some((State::Running, intent.attempt)) {
                continue;
            }
            if pending
                .iter()
                .any(|(m, a)| *m == intent.member && *a == intent.attempt)
            {
                continue;
            }
            let Ok(target) = serde_json::from_value::<TargetRecord>(intent.target.clone()) else {
                continue;
            };
            follow.push((intent, target.into_target()));
        }
        let now = now();
        for (intent, target) in follow {
            let key = operation_key(&self.fleet, &run, intent.attempt);
            // The deadline counts from the first send, not from this restart.
            let spent = intent.recorded_at.map_or(Duration::ZERO, |at| {
                Duration::from_secs(now.unix().saturating_sub(at.unix()).max(0) as u64)
            });
            self.spawn_upgrade(
                &run,
                intent.member.clone(),
                intent.attempt,
                target,
                key,
                intent.operation_id.clone(),
                true,
                spent,
            );
        }
        for (member, attempt) in pending {
            self.spawn_observe(&run, member, attempt);
        }
        Ok(())
    }

    /// Drives a run the fleet's engine holds (loaded from the store, or made here): what the
    /// task keeps for it beside its engine. `stored_current`: the stored status is the run's as
    /// it is now (it was just made), so nothing is written until the run changes.
    fn drive(
        &mut self,
        run: &str,
        base: Value,
        snapshot_etag: String,
        (log_cost, checkpoint_bytes): (u64, u64),
        stored_current: bool,
    ) {
        let mut status = StatusChanges::new();
        self.engine.refresh_status(run, &mut status);
        self.meta.insert(
            run.to_string(),
            RunMeta {
                base,
                forecast: None,
                operations: HashMap::new(),
                outstanding: Default::default(),
                // A stored status may be older than the log the run was rebuilt from.
                status_dirty: !stored_current,
                status,
                last_status_write: None,
                status_bytes: 0,
                chunks_written: Vec::new(),
                around: None,
                snapshot_etag,
                unwritten: Vec::new(),
                log_cost,
                checkpoint_bytes,
                loaded_at: Instant::now(),
            },
        );
        if let Ok(mut driving) = self.driving.lock() {
            driving.insert(run.to_string());
        }
    }

    /// Creates (or replaces, before it starts) a run as the fleet's engine decides it (SEMANTICS
    /// §2): over its member table, first brought up to date with the members as stored. The run
    /// is recorded (its snapshot, its document, its head) before the engine takes it in, so
    /// nothing changes if it is refused or the store refuses it.
    async fn create(
        &mut self,
        now: Time,
        request: CreateRequest,
        members: Vec<SharedMember>,
    ) -> Result<CreatedRun, ApiError> {
        let name = request.run.clone();
        let store = self.runs.store.clone();
        let refused = |e: StoreError| ApiError::conflict(e.to_string());
        // Only a run not started yet is replaced; the one driven here knows best.
        let existing = store
            .get_raw(&self.fleet, Kind::Run, &name)
            .await
            .map_err(refused)?;
        if let Some((text, _)) = &existing {
            if request.create_only {
                return Err(ApiError::conflict(format!(
                    "update run {name:?} exists; If-None-Match: * never replaces a run"
                )));
            }
            let state = match self.engine.run(&name) {
                Some(engine) => format!("{:?}", engine.state()),
                None => crate::run_head::RunHead::parse(text).state().to_string(),
            };
            if state != "NotStarted" {
                return Err(ApiError::conflict(format!(
                    "update run {name:?} is {state}; a run can be changed only before it starts"
                )));
            }
        }
        self.engine.take_stored_members(now, members);
        let spec = RunSpec {
            strategy: request
                .strategy
                .as_ref()
                .map(|s| parse_strategy(s, "properties.strategy", DEFAULT_STAGE_CONCURRENCY_LIMIT))
                .transpose()?,
            upgrade: parse_upgrade(&request.update, "properties.managedClusterUpdate")?,
            rules: request.rules,
        };
        let unknown: Vec<(SharedMember, ApiError)> = request
            .unobserved
            .iter()
            .map(|u| {
                let member = SharedMember {
                    name: u.name.as_str().into(),
                    cluster_resource_id: u.cluster_resource_id.as_str().into(),
                    group: u.group.clone(),
                    labels: u.labels.clone(),
                    cluster: Arc::new(Cluster::unknown()),
                };
                (member, u.why.clone())
            })
            .collect();
        // A run replaced is no longer driven: its name is free for the new one.
        let replaced = self.engine.remove_run(&name);
        let planned = self
            .engine
            .plan_run(&name, &spec, request.catalog.clone(), &unknown);
        let (mut engine, warnings) = match planned {
            Ok(made) => made,
            Err(e) => {
                if let Some(old) = replaced {
                    let _ = self.engine.adopt_run(now, &name, old);
                }
                return Err(e);
            }
        };
        if replaced.is_some() {
            self.drop_run(&name);
        }
        let snapshot = RunOrigin {
            making: RunMaking::Spec(spec),
            members: self.engine.table().cloned().collect(),
            catalog: request.catalog,
            promoted_from: request.promoted_from.clone(),
            time_scale: self.driver.time_scale(),
        };
        snapshot.apply_settings(&mut engine);
        let status = engine.status();
        let head = crate::run_head::head_of(&status);
        let mut properties = json!({
            "provisioningState": "Succeeded",
            "managedClusterUpdate": request.update,
        });
        if let Some(s) = &request.strategy {
            properties["strategy"] = json!(s);
        }
        if let Some(id) = request.strategy_id {
            properties["updateStrategyId"] = json!(id);
        }
        if request.rules.chain_minor_versions {
            properties["chainMinorVersions"] = json!(true);
        }
        if let Some(id) = request.profile_id {
            properties["autoUpgradeProfileId"] = json!(id);
        }
        let base = json!({
            "id": format!("/v1/fleets/{}/updateRuns/{name}", self.fleet),
            "name": name,
            "type": "Microsoft.ContainerService/fleets/updateRuns",
            "systemData": request.system_data,
            "properties": properties,
        });
        // Rendered straight to text: a large run's status is never built as a JSON tree.
        let unwritable =
            |e: serde_json::Error| ApiError::conflict(format!("cannot write the run: {e}"));
        let text = run_document(&base, &status).map_err(unwritable)?;
        drop(status);
        let internal = snapshot_document(&snapshot, now).map_err(unwritable)?;
        drop(snapshot);
        let mut when = match request.if_match {
            Some(etag) => Precondition::IfMatch(etag),
            None if request.create_only => Precondition::IfNoneMatchAny,
            None => Precondition::None,
        };
        // A run replaced before it started starts from a clean log.
        if existing.is_some() {
            store
                .delete(&self.fleet, Kind::Run, &name, &when)
                .await
                .map_err(refused)?;
            when = Precondition::None;
        }
        let recorded = self
            .record_run(&name, &internal, &text, &head, &when)
            .await?;
        drop(internal);
        let (snapshot_etag, etag, created) = recorded;
        self.engine.take_run(&name, engine)?;
        self.drive(&name, base, snapshot_etag, (0, 0), true);
        Ok(CreatedRun {
            text,
            etag,
            created,
            warnings,
        })
    }

    /// Records a run made here before the fleet's engine takes it in: its snapshot, its document
    /// (under `when`) and its head. Answers the snapshot's eTag, the document's, and whether the
    /// document was created.
    async fn record_run(
        &self,
        name: &str,
        snapshot: &str,
        document: &str,
        head: &str,
        when: &Precondition,
    ) -> Result<(String, String, bool), ApiError> {
        let store = &self.runs.store;
        let refused = |e: StoreError| ApiError::conflict(e.to_string());
        let (snapshot_etag, _) = store
            .put_raw(
                &self.fleet,
                Kind::RunSnapshot,
                name,
                snapshot,
                &Precondition::None,
            )
            .await
            .map_err(refused)?;
        let (etag, created) = store
            .put_raw(&self.fleet, Kind::Run, name, document, when)
            .await
            .map_err(refused)?;
        // Were this lost (a crash between the two writes), the run's document is read instead.
        store
            .init_run_head(&self.fleet, name, head)
            .await
            .map_err(refused)?;
        Ok((snapshot_etag, etag, created))
    }

    /// Rolls back run `original` as the fleet's engine decides (SEMANTICS §15) and answers the
    /// rollback run's name. A new rollback run is recorded first (its plan as its snapshot, its
    /// document, its head), so a restart finds it, and nothing changes if the store refuses;
    /// then the engine makes and starts it, and tells the original.
    async fn roll_back(
        &mut self,
        now: Time,
        original: &str,
        system_data: &Value,
    ) -> Result<String, ApiError> {
        use flotilla_engine::fleet_engine::RollbackRequest;
        let RollbackRequest::New { name, plan } = self.engine.rollback_request(original)? else {
            return self.engine.create_rollback_run(now, original);
        };
        let mut engine = self.engine.plan_rollback_run(&name, &plan)?;
        let update = ManagedClusterUpdateSpec {
            upgrade: Some(flotilla_engine::strategy::UpgradeSpec {
                upgrade_type: Some(plan.upgrade_type.as_str().to_string()),
                kubernetes_version: None,
            }),
            node_image_selection: None,
        };
        let snapshot = RunOrigin {
            members: self.engine.plan_members(&plan),
            making: RunMaking::Rollback(plan),
            catalog: self.engine.catalog().clone(),
            promoted_from: None,
            time_scale: self.driver.time_scale(),
        };
        snapshot.apply_settings(&mut engine);
        let status = engine.status();
        let base = json!({
            "id": format!("/v1/fleets/{}/updateRuns/{name}", self.fleet),
            "name": name,
            "type": "Microsoft.ContainerService/fleets/updateRuns",
            "systemData": system_data,
            "properties": {
                "provisioningState": "Succeeded",
                "managedClusterUpdate": update,
                "rollbackOf": original,
            },
        });
        let unwritable =
            |e: serde_json::Error| ApiError::conflict(format!("cannot write the run: {e}"));
        let text = run_document(&base, &status).map_err(unwritable)?;
        let head = crate::run_head::head_of(&status);
        drop(status);
        let internal = snapshot_document(&snapshot, now).map_err(unwritable)?;
        drop(snapshot);
        let when = Precondition::IfNoneMatchAny;
        let (snapshot_etag, _, _) = self
            .record_run(&name, &internal, &text, &head, &when)
            .await?;
        self.engine
            .take_rollback_run(now, original, &name, engine)?;
        self.drive(&name, base, snapshot_etag, (0, 0), false);
        Ok(name)
    }

    /// Starts the forecast of the fleet's moving runs when one is due: on a copy of the fleet's
    /// engine, off the task, its answer coming back as [`Msg::Forecast`].
    pub(super) fn forecast_if_due(&mut self) {
        if self.pace.due().is_none_or(|due| due > Instant::now()) {
            return;
        }
        self.pace.dirty = false;
        let any_moving = self
            .engine
            .run_names()
            .any(|r| self.engine.run(r).is_some_and(moving));
        if !any_moving {
            // Nothing to forecast, and nothing spent: a run that starts next is forecast at once.
            self.take_forecast(Some((now(), BTreeMap::new())));
            return;
        }
        self.pace.last = Some(Instant::now());
        self.pace.running = true;
        let copy = self.engine.clone().without_journal();
        let store = self.runs.store.clone();
        let (fleet, driver, tx) = (self.fleet.clone(), self.driver.clone(), self.tx.clone());
        tokio::spawn(async move {
            let params = ForecastParams::default();
            let made = match Durations::load(store.as_ref(), &fleet, &copy, driver, params).await {
                Ok(durations) => tokio::task::spawn_blocking(move || {
                    let at = now();
                    let duration = |r: &str, m: &str| durations.of(&copy, r, m);
                    (at, completions(&copy, at, &params, &duration))
                })
                .await
                .ok(),
                Err(e) => {
                    tracing::warn!(%fleet, error = %e, "cannot read upgrade durations for the runs' forecast");
                    None
                }
            };
            let _ = tx.send(Msg::Forecast { made });
        });
    }

    /// A forecast made off the task: each moving run's status shows it (a run it does not name
    /// shows none).
    pub(super) fn take_forecast(&mut self, made: Option<(Time, BTreeMap<String, Option<Time>>)>) {
        self.pace.running = false;
        tracing::debug!(fleet = %self.fleet, made = ?made, "the runs' forecast");
        let Some((at, ends)) = made else {
            // Tried again when something next changes.
            return;
        };
        for (run, meta) in self.meta.iter_mut() {
            let forecast = ends.get(run).map(|end| RunForecast {
                completed_time: *end,
                computed_at: at,
            });
            if meta.forecast != forecast {
                meta.forecast = forecast;
                meta.status_dirty = true;
            }
        }
    }

    /// Stops driving a run (replaced, deleted, finished, or its batch could not be written).
    pub(super) fn drop_run(&mut self, run: &str) {
        self.engine.remove_run(run);
        self.meta.remove(run);
        if let Ok(mut driving) = self.driving.lock() {
            driving.remove(run);
        }
    }

    /// Applies a batch of messages at one instant, records what each run was given, then acts.
    /// Returns false if the fleet's task must end (the lease was lost).
    pub(super) async fn step(&mut self, batch: Vec<Msg>, woke_at: Option<Instant>) -> bool {
        if batch.iter().any(|m| matches!(m, Msg::Abandon)) {
            // Told to stop: nothing of this batch is applied; actions are answered or handed
            // over again.
            for msg in batch {
                self.turn_away(msg);
            }
            return false;
        }
        let now = now();
        let mut steps: HashMap<String, RunStep> = HashMap::new();
        let mut finish_seen: Option<Instant> = None;
        let mut action_at: Option<Instant> = None;
        // What users and clusters say can move the runs' ends.
        self.pace.dirty |= batch.iter().any(|m| {
            matches!(
                m,
                Msg::Action { .. }
                    | Msg::Create { .. }
                    | Msg::RollBack { .. }
                    | Msg::Remote { .. }
                    | Msg::Observed { .. }
                    | Msg::Joined(_)
                    | Msg::Left { .. }
                    | Msg::Adopt { .. }
                    | Msg::Driver(_)
            )
        });
        for msg in batch {
            match msg {
                Msg::Abandon => {}
                Msg::Observed { member, cluster } => {
                    let _ = self
                        .engine
                        .handle(now, FleetInput::Observed { member, cluster });
                }
                Msg::Joined(members) => {
                    for member in members {
                        let _ = self.engine.handle(now, FleetInput::MemberAdded(member));
                    }
                }
                Msg::Left { member } => {
                    let _ = self
                        .engine
                        .handle(now, FleetInput::MemberRemoved { member });
                }
                Msg::Adopt { run, loaded, reply } => {
                    let _ = reply.send(self.adopt(run, *loaded));
                }
                Msg::Copy { reply } => {
                    let _ = reply.send(Box::new(self.engine.clone().without_journal()));
                }
                Msg::Forecast { made } => self.take_forecast(made),
                Msg::Driver(driver) => self.driver = driver,
                Msg::Partitions { reply } => {
                    let _ = reply.send(
                        self.engine
                            .budget_partitions()
                            .map(|(p, n)| (p.clone(), n))
                            .collect(),
                    );
                }
                Msg::Rules(rules) => {
                    self.pace.dirty |= apply_rules(&mut self.engine, now, rules);
                }
                Msg::Retire { run } => self.drop_run(&run),
                Msg::Remote { run, id, input } => {
                    if !self.meta.contains_key(&run) {
                        // Handed over again on the next pass, when the run is loaded.
                        self.runs.undeliver(&self.fleet, id);
                        continue;
                    }
                    action_at = Some(action_at.unwrap_or_else(Instant::now));
                    let result = self.engine.handle(
                        now,
                        FleetInput::Run {
                            run: run.clone(),
                            input,
                        },
                    );
                    steps.entry(run).or_default().action_results.push((
                        id,
                        match result {
                            Ok(()) => json!({"ok": true}),
                            Err(e) => json!({"error": e}),
                        },
                    ));
                }
                Msg::Action {
                    run,
                    input,
                    reply,
                    at,
                } => {
                    if !self.meta.contains_key(&run) {
                        let _ = reply.send(Err(Refusal::NotLoaded));
                        continue;
                    }
                    action_at = Some(action_at.map_or(at, |a: Instant| a.min(at)));
                    let result = self.engine.handle(
                        now,
                        FleetInput::Run {
                            run: run.clone(),
                            input,
                        },
                    );
                    steps.entry(run).or_default().replies.push((reply, result));
                }
                Msg::Create {
                    request,
                    members,
                    answer,
                } => {
                    let result = self.create(now, *request, members).await;
                    match answer {
                        CreateAnswer::Caller(reply) => {
                            let _ = reply.send(result);
                        }
                        CreateAnswer::Remote(id) => {
                            let outcome = match result {
                                Ok(made) => {
                                    json!({"ok": true, "created": made.created, "warnings": made.warnings})
                                }
                                Err(e) => json!({"error": e}),
                            };
                            if self.runs.store.finish_action(id, &outcome).await.is_err() {
                                self.runs.undeliver(&self.fleet, id);
                            }
                        }
                    }
                }
                Msg::RollBack {
                    original,
                    system_data,
                    answer,
                    at,
                } => {
                    if !self.meta.contains_key(&original) {
                        self.refuse(answer, Refusal::NotLoaded);
                        continue;
                    }
                    action_at = Some(action_at.map_or(at, |a: Instant| a.min(at)));
                    let result = self.roll_back(now, &original, &system_data).await;
                    // Answered with the batch of the rollback run, written first (it is
                    // answered at once), so its caller finds it started.
                    let run = match &result {
                        Ok(made) if self.meta.contains_key(made) => made.clone(),
                        _ => original,
                    };
                    let step = steps.entry(run).or_default();
                    match answer {
                        Answer::Caller(reply) => step.replies.push((reply, result.map(|_| ()))),
                        Answer::Remote(id) => step.action_results.push((
                            id,
                            match result {
                                Ok(_) => json!({"ok": true}),
                                Err(e) => json!({"error": e}),
                            },
                        )),
                    }
                }
                Msg::Input {
                    run,
                    input,
                    observed_at,
                } => {
                    let Some(meta) = self.meta.get_mut(&run) else {
                        // A follower of a run no longer driven: its answer goes nowhere.
                        continue;
                    };
                    let step = steps.entry(run.clone()).or_default();
                    match &input {
                        Input::OperationFinished { attempt, .. } => {
                            step.finished_attempts.push(*attempt);
                            meta.outstanding.remove(attempt);
                            if let Some(t) = observed_at {
                                finish_seen = Some(finish_seen.map_or(t, |f| f.min(t)));
                            }
                        }
                        Input::Observed {
                            operation: Some((attempt, OperationProgress::NotRunning)),
                            ..
                        } => {
                            meta.outstanding.remove(attempt);
                        }
                        Input::OperationAccepted {
                            attempt,
                            operation_id,
                            ..
                        } => {
                            meta.operations.insert(*attempt, operation_id.clone());
                        }
                        _ => {}
                    }
                    let _ = self.engine.handle(now, FleetInput::Run { run, input });
                }
            }
        }
        self.engine.settle(now);
        // Members' last operations (API.md: `status.lastOperationId`, `lastOperationError`):
        // an upgrade sent names its operation and clears the error; a failure sets it.
        let mut operations: BTreeMap<String, Value> = BTreeMap::new();
        // The run each member's newest operation of this step belongs to.
        let mut sent_by: HashMap<String, String> = HashMap::new();
        while let Some(FleetCommand { run, command }) = self.engine.poll_command() {
            if let Command::StartUpgrade {
                member, attempt, ..
            } = &command
            {
                operations.insert(
                    member.clone(),
                    json!({"lastOperationId": operation_key(&self.fleet, &run, *attempt), "lastOperationError": null}),
                );
                sent_by.insert(member.clone(), run.clone());
            }
            let step = steps.entry(run).or_default();
            if let Command::StartUpgrade {
                member,
                attempt,
                target,
            } = &command
            {
                step.intents.push(Intent {
                    attempt: *attempt,
                    member: member.clone(),
                    target: serde_json::to_value(TargetRecord::from(target)).unwrap_or_default(),
                    operation_id: None,
                    finished: false,
                    recorded_at: Some(now),
                });
            }
            step.commands.push(command);
        }
        // Hops that ended at one instant, per member: the nth event of a member's hop ending
        // at an instant is its nth hop completed then.
        let mut hops_ended: HashMap<(String, String, Time), usize> = HashMap::new();
        while let Some(FleetEvent { run, event }) = self.engine.poll_event() {
            // An upgrade that succeeded: how long it took, for forecasts (SEMANTICS §11). A
            // forecast counts each hop of a chain as one upgrade of the run's type (§13), so a
            // chained member's history is its hops, each recorded as it ends, not the chain.
            let duration = (|| {
                let member = event.member.clone()?;
                let engine = self.engine.run(&run)?;
                let start = match event.kind {
                    EventType::MemberSucceeded if engine.member_hops(&member).is_empty() => {
                        engine.member_started(&member)?
                    }
                    EventType::MemberHopSucceeded => {
                        let nth = hops_ended
                            .entry((run.clone(), member.clone(), event.time))
                            .or_default();
                        let hop = engine
                            .member_hops(&member)
                            .iter()
                            .filter(|h| {
                                h.state == State::Completed && h.completed_time == Some(event.time)
                            })
                            .nth(*nth)?;
                        *nth += 1;
                        hop.start_time
                    }
                    _ => return None,
                };
                Some(UpgradeDuration {
                    member,
                    upgrade_type: engine.upgrade().upgrade_type.as_str().to_string(),
                    seconds: (event.time.unix() - start.unix()).max(0),
                    finished_at: event.time,
                })
            })();
            // A failure belongs with the operation it ended, not with one another run sent
            // the member in the same step.
            if event.kind == EventType::MemberFailed
                && let Some(member) = &event.member
                && sent_by.get(member).is_none_or(|r| *r == run)
            {
                let error = match &event.error {
                    Some(e) => json!({"code": e.code, "message": e.message}),
                    None => json!({"code": "UpgradeFailed", "message": event.message}),
                };
                operations
                    .entry(member.clone())
                    .or_insert_with(|| json!({}))["lastOperationError"] = error;
            }
            self.pace.dirty |= matches!(
                event.kind,
                EventType::RunStarted
                    | EventType::RunStopped
                    | EventType::MemberSucceeded
                    | EventType::MemberFailed
                    | EventType::MemberSkipped
                    | EventType::GateCompleted
                    | EventType::GateSkipped
                    | EventType::WaitSkipped
            );
            let step = steps.entry(run).or_default();
            step.durations.extend(duration);
            // A HealthCheck gate that fails is a gate resource whose state changes too
            // (SEMANTICS §10): without it, GET …/gates answered Pending for a failed gate.
            step.gates_changed |= matches!(
                event.kind,
                EventType::GatePending
                    | EventType::GateCompleted
                    | EventType::GateSkipped
                    | EventType::GateFailed
            );
            // Runs, stages, groups, gates and waits changing are shown at once; member churn is
            // what gets batched.
            step.structural |= !matches!(
                event.kind,
                EventType::MemberPending
                    | EventType::MemberStarted
                    | EventType::MemberReattached
                    | EventType::MemberSucceeded
                    | EventType::MemberFailed
                    | EventType::MemberSkipped
                    | EventType::MemberStopped
            );
            self.runs.metrics.observe_event(&self.fleet, &event);
            step.events
                .push(serde_json::to_value(&event).unwrap_or_default());
        }
        // What the fleet now sees of its clusters (observations, upgrades that succeeded) lands
        // in the members before the runs' progress does, so whoever sees a run move on sees the
        // clusters it changed, and a task started later loads the table as it is.
        let mut statuses: Vec<(String, Value)> = self
            .engine
            .take_changed_members()
            .into_iter()
            .map(|(member, cluster)| {
                let operation = operations.remove(member.as_ref());
                (
                    member.to_string(),
                    member_status(&cluster.spec(), now, operation),
                )
            })
            .collect();
        for (member, operation) in operations {
            if let Some(cluster) = self.engine.cluster(&member) {
                let status = member_status(&cluster.spec(), now, Some(operation));
                statuses.push((member, status));
            }
        }
        if let Err(e) = self
            .runs
            .store
            .set_statuses(&self.fleet, Kind::Member, &statuses)
            .await
        {
            // The members show an older observation until the next change; the runs' own
            // records are unaffected, and a task started later observes again.
            tracing::warn!(fleet = %self.fleet, error = %e, "cannot record the members' clusters");
        }
        // Each run driven gets its batch when it was given something, has something to say,
        // or has a status left to write.
        // Runs with upgrades to send are written first, then those with callers waiting, then
        // the rest by how long their statuses have waited.
        let mut names: Vec<String> = self.meta.keys().cloned().collect();
        names.sort_by_key(|run| {
            let step = steps.get(run);
            (
                step.is_none_or(|s| s.commands.is_empty()),
                step.is_none_or(|s| s.replies.is_empty() && s.action_results.is_empty()),
                self.meta.get(run).and_then(|m| m.last_status_write),
            )
        });
        let budget = Instant::now() + STATUS_BUDGET;
        // What made this step's starts possible, and when (SEMANTICS: no polling delay).
        let trigger = finish_seen
            .map(|t| ("slot", t))
            .or(action_at.map(|t| ("action", t)))
            .or(woke_at.map(|t| ("timer", t)));
        let mut fenced = false;
        let mut later: Vec<(String, RunStep, RunBatch)> = Vec::new();
        for run in names {
            let fresh = self.engine.take_journal(&run);
            let mut step = steps.remove(&run).unwrap_or_default();
            let Some(meta) = self.meta.get_mut(&run) else {
                continue;
            };
            let mut log = std::mem::take(&mut meta.unwritten);
            log.extend(fresh);
            // Whether what a reader sees changed, for a run that was given anything (news of a
            // lock on a member the run has not reached changes nothing).
            let given = !log.is_empty() || !step.events.is_empty() || !step.commands.is_empty();
            if given && self.engine.refresh_status(&run, &mut meta.status) != Some(false) {
                meta.status_dirty = true;
            }
            let Some(engine) = self.engine.run(&run) else {
                continue;
            };
            // The status is a view of the log: written at once when someone waits for it (an
            // API action) or the run ends, otherwise at most every `status_every`, so a large
            // run's many small steps do not each rewrite its whole status.
            let urgent = step.structural
                || !step.replies.is_empty()
                || !step.action_results.is_empty()
                || engine.is_finished();
            // A status that is only due (nobody waits for it) is rendered while this step's
            // budget lasts, oldest first; the rest wait for a later step, so many large runs
            // rewriting their statuses never hold up the fleet's dispatch.
            let due = meta
                .last_status_write
                .is_none_or(|t| t.elapsed() >= meta.status_every())
                && Instant::now() < budget;
            let write_status = meta.status_dirty && (urgent || due);
            // What this step shows of the run: events, intents, results, answers, a status.
            // A step that shows nothing (a lock taken elsewhere that changed no message, say)
            // keeps its log entries for the run's next batch: nothing anyone saw depends on
            // them, and a run rebuilt without them is told the fleet's locks again at its
            // first turn. So a hundred runs hearing of one start cost no hundred writes.
            let shows = !step.events.is_empty()
                || !step.intents.is_empty()
                || !step.finished_attempts.is_empty()
                || !step.action_results.is_empty()
                || !step.replies.is_empty()
                || !step.commands.is_empty()
                || write_status
                || engine.is_finished();
            // Entries held back are bounded: past UNWRITTEN_MAX they are written anyway.
            if !shows && log.len() <= UNWRITTEN_MAX {
                meta.unwritten = log;
                continue;
            }
            if write_status {
                meta.status_dirty = false;
                meta.last_status_write = Some(Instant::now());
            }
            let (body, head) = match write_status.then(|| status_document(meta, engine)) {
                None => (None, None),
                Some(Ok((document, head))) => (Some(document), Some(head)),
                Some(Err(e)) => {
                    tracing::error!(fleet = %self.fleet, run, error = %e, "cannot render the run's status");
                    (None, None)
                }
            };
            let gates = if step.gates_changed {
                gate_resources(&self.fleet, &run, engine, &meta.base["systemData"])
            } else {
                Vec::new()
            };
            let log = crate::journal::encode(log);
            // A checkpoint after this batch's entries replaces the log before them.
            let after = self
                .runs
                .checkpoint_after
                .load(std::sync::atomic::Ordering::Relaxed);
            let checkpoint = if meta.checkpoint_due(&log, after) {
                match engine.checkpoint(now) {
                    Ok(text) => {
                        meta.log_cost = 0;
                        meta.checkpoint_bytes = text.len() as u64;
                        self.runs.metrics.count_checkpoint();
                        Some(text)
                    }
                    Err(e) => {
                        tracing::warn!(fleet = %self.fleet, run, error = %e, "cannot checkpoint the run");
                        None
                    }
                }
            } else {
                None
            };
            let mut batch = RunBatch {
                fleet: self.fleet.clone(),
                run: run.clone(),
                log,
                checkpoint,
                intents: std::mem::take(&mut step.intents),
                finished_attempts: std::mem::take(&mut step.finished_attempts),
                events: std::mem::take(&mut step.events),
                run_body: body,
                run_head: head,
                gates,
                action_results: std::mem::take(&mut step.action_results),
                durations: std::mem::take(&mut step.durations),
                fence: Some(self.fence.clone()),
                snapshot_etag: Some(meta.snapshot_etag.clone()),
            };
            // A batch someone waits for, or with upgrades to send, is written at once, so one
            // run's upgrades never wait for another's write; the step's other batches (the
            // news other runs heard) are written together after, with one sync to disk.
            if step.commands.is_empty()
                && step.replies.is_empty()
                && batch.action_results.is_empty()
            {
                later.push((run, step, batch));
                continue;
            }
            let result = self.runs.store.write_run_batch(&batch).await;
            if !self.written(&run, step, &mut batch, result, trigger, &mut steps) {
                fenced = true;
                break;
            }
        }
        if !fenced && !later.is_empty() {
            let (runs, (steps_later, mut batches)): (Vec<String>, (Vec<RunStep>, Vec<RunBatch>)) =
                later.into_iter().map(|(r, s, b)| (r, (s, b))).unzip();
            // Refused whole, every batch gets the refusal (a lost lease ends the step at the
            // first).
            let results = self
                .runs
                .store
                .write_run_batches(&batches)
                .await
                .unwrap_or_else(|e| {
                    let fence = matches!(e, StoreError::Fenced(_));
                    let why = e.to_string();
                    runs.iter()
                        .map(|_| {
                            Err(if fence {
                                StoreError::Fenced(why.clone())
                            } else {
                                StoreError::Unavailable(why.clone())
                            })
                        })
                        .collect()
                });
            for (((run, step), batch), result) in
                runs.iter().zip(steps_later).zip(&mut batches).zip(results)
            {
                if !self.written(run, step, batch, result, trigger, &mut steps) {
                    fenced = true;
                    break;
                }
            }
        }
        if fenced {
            return false;
        }
        // A run that is over, with nothing left to follow, is no longer driven.
        let done: Vec<String> = self
            .meta
            .iter()
            .filter(|(run, meta)| {
                meta.outstanding.is_empty()
                    && !meta.status_dirty
                    && meta.unwritten.is_empty()
                    && meta.loaded_at.elapsed() >= LOADED_KEPT
                    && self.engine.run(run).is_some_and(|e| e.is_finished())
            })
            .map(|(run, _)| run.clone())
            .collect();
        for run in done {
            self.drop_run(&run);
        }
        true
    }

    /// What follows a run's batch, written or refused. Returns false when the fleet's lease
    /// was lost (every waiting caller is answered so), and the step must end.
    pub(super) fn written(
        &mut self,
        run: &str,
        mut step: RunStep,
        batch: &mut RunBatch,
        result: Result<(), StoreError>,
        trigger: Option<(&'static str, Instant)>,
        steps: &mut HashMap<String, RunStep>,
    ) -> bool {
        // The events go on to the live streams once written.
        step.events = std::mem::take(&mut batch.events);
        // Handed-over actions are done with either way: answered now, or pending again.
        for (id, _) in &batch.action_results {
            self.runs.undeliver(&self.fleet, *id);
        }
        match result {
            Ok(()) => self.carry_out(run, step, trigger),
            Err(StoreError::Fenced(why)) => {
                tracing::warn!(fleet = %self.fleet, run, why, "stopped driving the fleet");
                self.runs.abandon(&self.fleet, self.fence.epoch);
                let lost = || {
                    Err(Refusal::Api(ApiError::conflict(
                        "this replica lost the fleet's lease; try again",
                    )))
                };
                for (reply, _) in step.replies {
                    let _ = reply.send(lost());
                }
                for (_, step) in steps.drain() {
                    for (reply, _) in step.replies {
                        let _ = reply.send(lost());
                    }
                }
                return false;
            }
            Err(e) => {
                let message = if let StoreError::Superseded(why) = &e {
                    tracing::info!(fleet = %self.fleet, run, why, "the run changed under its task; no longer driving it");
                    "the update run was replaced or deleted".to_string()
                } else {
                    tracing::error!(fleet = %self.fleet, run, error = %e, "cannot record the run's progress; reloading it");
                    self.runs.reload_later(&self.fleet, run);
                    format!("the change could not be recorded: {e}")
                };
                for (reply, _) in step.replies {
                    let _ = reply.send(Err(Refusal::Api(ApiError::conflict(message.clone()))));
                }
                // Its engine went ahead of its log: it is dropped, and loaded again from the
                // log when next needed.
                self.drop_run(run);
            }
        }
        true
    }

    /// After a run's batch is written: answers its callers, publishes its events and sends
    /// its commands to the driver.
    pub(super) fn carry_out(
        &mut self,
        run: &str,
        step: RunStep,
        trigger: Option<(&'static str, Instant)>,
    ) {
        for (reply, result) in step.replies {
            let _ = reply.send(result.map_err(Refusal::Api));
        }
        for event in step.events {
            let _ = self.runs.events.send(RunEvent {
                fleet: self.fleet.clone(),
                run: run.to_string(),
                event,
            });
        }
        for command in step.commands {
            match command {
                Command::StartUpgrade {
                    member,
                    attempt,
                    target,
                } => {
                    if let Some((kind, since)) = trigger {
                        self.runs
                            .metrics
                            .record_dispatch_delay(kind, since.elapsed());
                    }
                    let key = operation_key(&self.fleet, run, attempt);
                    self.spawn_upgrade(
                        run,
                        member,
                        attempt,
                        target,
                        key,
                        None,
                        false,
                        Duration::ZERO,
                    );
                }
                Command::Observe { member, attempt } => self.spawn_observe(run, member, attempt),
                Command::Evaluate {
                    subject,
                    round,
                    checks,
                    context,
                } => self.spawn_evaluate(run, subject, round, checks, context),
            }
        }
    }

    /// What lets an attempt's follower send: this fleet's lease at the epoch held now.
    pub(super) fn permit(&self, run: &str, attempt: u64) -> LeasePermit {
        LeasePermit {
            runs: self.runs.clone(),
            fleet: self.fleet.clone(),
            run: run.to_string(),
            epoch: self.fence.epoch,
            attempt,
        }
    }

    pub(super) fn report(&self, run: &str) -> RunReport {
        RunReport {
            tx: self.tx.clone(),
            run: run.to_string(),
        }
    }

    /// Sends an upgrade (unless recovering one the driver may already have) and follows it to a
    /// definitive answer (`crate::operation::drive`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn spawn_upgrade(
        &mut self,
        run: &str,
        member: String,
        attempt: u64,
        target: Target,
        key: String,
        known: Option<String>,
        recovering: bool,
        spent: Duration,
    ) {
        let driver = self.driver.clone();
        let report = self.report(run);
        let permit = self.permit(run, attempt);
        let who = self.member_ref(run, &member);
        if let Some(meta) = self.meta.get_mut(run) {
            meta.outstanding.insert(attempt);
        }
        crate::clock::spawn(async move {
            let begin = match known {
                Some(id) => crate::operation::Begin::Follow(id),
                None if recovering => {
                    // Taken over from another replica: a send it began just before its lease ran
                    // out may still be on its way to the driver; give it a lease's time to land
                    // before asking the driver whether it knows the key (SEMANTICS §7).
                    if let Some(wait) = permit.runs.replica.settling(&permit.fleet, permit.epoch)
                        && permit.runs.store.shared()
                    {
                        tokio::time::sleep(wait).await;
                    }
                    crate::operation::Begin::Ask
                }
                None => crate::operation::Begin::Send,
            };
            let attempt = crate::operation::Attempt {
                who,
                member,
                attempt,
                target,
                key,
                spent,
            };
            crate::operation::drive(driver, report, permit, attempt, begin).await;
        });
    }

    /// Makes a round of evaluations for real, each check at once, and hands each result back
    /// as an input at the instant it comes (SEMANTICS §10).
    pub(super) fn spawn_evaluate(
        &mut self,
        run: &str,
        subject: flotilla_engine::engine::CheckSubject,
        round: u64,
        checks: Arc<flotilla_engine::checks::Checks>,
        context: flotilla_engine::checks::Context,
    ) {
        use flotilla_engine::engine::CheckSubject;
        let report = self.report(run);
        let runs = self.runs.clone();
        let fleet = self.fleet.clone();
        let allow = self.runs.drivers.exec_allowed();
        crate::clock::spawn(async move {
            use crate::operation::Report;
            // `{label:KEY}` is the member's label, read from its resource when a check uses one.
            let member = match &subject {
                CheckSubject::Soak { member } | CheckSubject::Readiness { member } => Some(member),
                CheckSubject::Gate { .. } => None,
            };
            let mut labels = std::collections::BTreeMap::new();
            if checks.uses("{label:")
                && let Some(member) = member
                && let Ok(Some(resource)) = runs.store.get(&fleet, Kind::Member, member).await
                && let Some(found) = resource.body["properties"]["labels"].as_object()
            {
                labels = found
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect();
            }
            let (context, labels, allow) = (Arc::new(context), Arc::new(labels), Arc::new(allow));
            for check in checks.checks.iter().cloned() {
                let (runs, report, subject) = (runs.clone(), report.clone(), subject.clone());
                let (context, labels, allow) = (context.clone(), labels.clone(), allow.clone());
                let fleet = fleet.clone();
                crate::clock::spawn(async move {
                    // A provider that cannot be read now, is gone, or no longer serves this
                    // fleet makes the evaluation unavailable (SEMANTICS §10).
                    let provider = runs
                        .providers
                        .get(runs.store.as_ref(), &check.provider)
                        .await
                        .ok()
                        .flatten()
                        .filter(|p| p.serves(&fleet));
                    let outcome = runs
                        .evaluator
                        .evaluate_limited(&check, provider.as_deref(), &context, &labels, &allow)
                        .await;
                    report.input(
                        Input::CheckEvaluated {
                            subject,
                            round,
                            check: check.name,
                            outcome,
                        },
                        None,
                    );
                });
            }
        });
    }

    /// After a stop and start: is the earlier operation still running, and where is the cluster?
    /// Asked until answered (`crate::operation::reattach`); then followed if it still runs.
    pub(super) fn spawn_observe(&mut self, run: &str, member: String, attempt: u64) {
        let driver = self.driver.clone();
        let report = self.report(run);
        let permit = self.permit(run, attempt);
        let who = self.member_ref(run, &member);
        let key = operation_key(&self.fleet, run, attempt);
        let Some(meta) = self.meta.get_mut(run) else {
            return;
        };
        let operation = meta
            .operations
            .get(&attempt)
            .cloned()
            .unwrap_or(key.clone());
        meta.outstanding.insert(attempt);
        let target = self.engine.run(run).and_then(|e| e.member_target(&member));
        crate::clock::spawn(async move {
            use crate::operation::Report;
            let (progress, cluster) =
                match crate::operation::reattach(&driver, &report, &who, &operation, &key).await {
                    crate::operation::Reattached::Answered(progress, cluster) => {
                        (progress, cluster)
                    }
                    crate::operation::Reattached::GaveUp(why) => {
                        report.input(
                            Input::OperationFinished {
                                member,
                                attempt,
                                outcome: Err(why),
                            },
                            Some(Instant::now()),
                        );
                        return;
                    }
                    crate::operation::Reattached::Gone => return,
                };
            let running = progress == OperationProgress::InProgress;
            report.input(
                Input::Observed {
                    member: member.clone(),
                    cluster: Arc::new(cluster),
                    operation: Some((attempt, progress)),
                },
                None,
            );
            if running && let Some(target) = target {
                let attempt = crate::operation::Attempt {
                    who,
                    member,
                    attempt,
                    target,
                    key,
                    spent: Duration::ZERO,
                };
                crate::operation::drive(
                    driver,
                    report,
                    permit,
                    attempt,
                    crate::operation::Begin::Follow(operation),
                )
                .await;
            }
        });
    }
}

/// A run's gates as API resources. A gate is created with its run (`run_system`, the run's
/// `systemData`) and last changed by whoever approved it.
pub(super) fn gate_resources(
    fleet: &str,
    run: &str,
    engine: &Engine,
    run_system: &Value,
) -> Vec<(String, Value)> {
    let run_id = format!("/v1/fleets/{fleet}/updateRuns/{run}");
    engine
        .gate_views()
        .into_iter()
        .map(|g| {
            let mut properties = json!({
                "provisioningState": "Succeeded",
                "gateType": g.gate_type,
                "target": {"id": run_id, "updateRunProperties": {"name": run, "stage": g.stage, "timing": format!("{:?}", g.timing)}},
                "state": format!("{:?}", g.state),
            });
            if let Some(group) = &g.group {
                properties["target"]["updateRunProperties"]["group"] = json!(group);
            }
            if let Some(name) = &g.display_name {
                properties["displayName"] = json!(name);
            }
            if let Some(config) = &g.scheduled {
                let mut scheduled = serde_json::to_value(config).unwrap_or_default();
                if let Some(at) = g.absolute_start {
                    scheduled["absoluteStartTime"] = json!(at);
                }
                properties["scheduledStartProperties"] = scheduled;
            }
            if let Some(by) = &g.approved_by {
                properties["approvedBy"] = json!(by);
            }
            if let Some(at) = g.approved_at {
                properties["approvedAt"] = json!(at);
            }
            let mut system = run_system.clone();
            if let (Some(by), Some(at), Some(data)) =
                (&g.approved_by, g.approved_at, system.as_object_mut())
            {
                data.insert("lastModifiedBy".into(), json!(by));
                data.insert("lastModifiedByType".into(), json!("User"));
                data.insert("lastModifiedAt".into(), json!(at));
            }
            let body = json!({
                "id": format!("/v1/fleets/{fleet}/gates/{}", g.id),
                "name": g.id,
                "type": "Microsoft.ContainerService/fleets/gates",
                "systemData": system,
                "properties": properties,
            });
            (g.id, body)
        })
        .collect()
}

/// The follower's reports go to the fleet's task, tagged with the run.
#[derive(Clone)]
pub(super) struct RunReport {
    pub(super) tx: Inbox,
    pub(super) run: String,
}

impl crate::operation::Report for RunReport {
    fn input(&self, input: Input, finished_at: Option<Instant>) -> bool {
        self.tx
            .send(Msg::Input {
                run: self.run.clone(),
                input,
                observed_at: finished_at,
            })
            .is_ok()
    }

    fn listening(&self) -> bool {
        !self.tx.is_closed()
    }
}
