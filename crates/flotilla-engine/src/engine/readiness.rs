//! Reaching a member: its priority class, the decision, and whether it may start now (SEMANTICS §1, §3).

use super::*;

impl Engine {
    pub(super) fn unplace(&mut self, m: u32) {
        let member = &mut self.members[m as usize];
        let g = member.group as usize;
        if let Place::Queued(class) = member.place {
            self.groups[g].ready.remove(&(class, m));
        }
        if member.state == State::Pending {
            member.state = State::NotStarted;
            member.message = None;
            self.groups[g].pending -= 1;
            self.revisions.touch(m);
        }
        member.waiting = None;
        member.place = Place::Nowhere;
        self.set_member_timer(m, None);
        self.end_watch(Subject::Readiness(m));
        self.budget_unindex(m);
    }

    /// The priority class of a member now (SEMANTICS §3) and the instant it changes.
    pub(super) fn class_of(&self, m: u32, now: Time) -> (u8, Option<Time>) {
        let Some(window) = self.window_of(&self.members[m as usize].cluster) else {
            return (CLASS_NO_WINDOW, None);
        };
        match window.next_opening(now) {
            None => (CLASS_CLOSED, None),
            Some(o) if o.from == now => (CLASS_OPEN, Some(o.until)),
            Some(o) if o.from.unix() - now.unix() <= SOON => (CLASS_SOON, Some(o.from)),
            Some(o) => (CLASS_CLOSED, Some(Time::from_unix(o.from.unix() - SOON))),
        }
    }

    /// Queues a member for its group to reach, in priority order (SEMANTICS §1, §3). A queued
    /// member is NotStarted: a Pending one that may start now (its window opened, its version
    /// arrived, another run let go of it) goes back to waiting for its group to come to it.
    pub(super) fn enqueue(&mut self, now: Time, m: u32) {
        let (class, changes) = self.class_of(m, now);
        let member = &mut self.members[m as usize];
        let g = member.group as usize;
        if let Place::Queued(old) = member.place {
            self.groups[g].ready.remove(&(old, m));
        }
        if member.state == State::Pending || member.message.is_some() {
            self.revisions.touch(m);
        }
        if member.state == State::Pending {
            member.state = State::NotStarted;
            self.groups[g].pending -= 1;
        }
        member.message = None;
        member.waiting = None;
        member.place = Place::Queued(class);
        self.groups[g].ready.insert((class, m));
        self.set_member_timer(m, changes);
        self.budget_unindex(m);
    }

    /// A reached member that will be upgraded but cannot start yet: Pending, holding no slot,
    /// until `wake` (or an input) makes it worth reaching again (SEMANTICS §3).
    pub(super) fn park(
        &mut self,
        now: Time,
        m: u32,
        wake: Option<Time>,
        message: String,
        reason: WaitReason,
    ) {
        let member = &mut self.members[m as usize];
        let g = member.group as usize;
        if let Place::Queued(class) = member.place {
            self.groups[g].ready.remove(&(class, m));
        }
        let newly = member.state != State::Pending;
        let changed = member.message.as_deref() != Some(message.as_str());
        if newly || changed {
            self.revisions.touch(m);
        }
        if newly {
            member.state = State::Pending;
            self.groups[g].pending += 1;
        }
        member.message = Some(message.as_str().into());
        member.waiting = Some(reason);
        member.place = Place::Parked;
        self.set_member_timer(m, wake);
        self.budget_parked(now, m, reason);
        if newly || changed {
            self.emit_member(now, EventType::MemberPending, m, Some(message));
        }
    }

    /// Parks a member for `reason`: one waiting for its readiness checks is evaluated (a new
    /// watch unless one is under way); one waiting for anything else first is not evaluated
    /// meanwhile (SEMANTICS §10).
    pub(super) fn park_for(
        &mut self,
        now: Time,
        m: u32,
        wake: Option<Time>,
        message: String,
        reason: WaitReason,
    ) {
        self.park(now, m, wake, message, reason);
        if reason == WaitReason::Readiness {
            self.ensure_readiness(now, m);
        } else {
            self.end_watch(Subject::Readiness(m));
        }
    }

    /// A Pending member's reason may have changed (a lock taken or released, the catalog): it
    /// stays Pending with the new reason, or is queued again if it may start now.
    pub(super) fn repark(&mut self, now: Time, m: u32) {
        if self.phase != RunPhase::Running || self.members[m as usize].place != Place::Parked {
            return;
        }
        match self.readiness(m, now) {
            Readiness::Ready => self.enqueue(now, m),
            Readiness::Wait {
                wake,
                message,
                reason,
            } => {
                self.park_for(now, m, wake, message, reason);
            }
        }
    }

    pub(super) fn window_of<'a>(&self, cluster: &'a Cluster) -> Option<&'a MaintenanceWindow> {
        match self.upgrade.upgrade_type {
            UpgradeType::NodeImageOnly => cluster.node_os_window.as_deref(),
            _ => cluster.kubernetes_window.as_deref(),
        }
    }

    /// Whether a reached member that will be upgraded can start now, and if not, until when it
    /// waits (SEMANTICS §3, §10): another run's operation, its target not yet in its region,
    /// its maintenance window, then its readiness checks.
    pub(super) fn readiness(&self, m: u32, now: Time) -> Readiness {
        match self.readiness_of_cluster(m, now) {
            Readiness::Ready => match self.readiness_checks(m, now) {
                None | Some(Readiness::Ready) => self.budget_readiness(m, now),
                Some(wait) => wait,
            },
            wait => wait,
        }
    }

    fn readiness_of_cluster(&self, m: u32, now: Time) -> Readiness {
        let member = &self.members[m as usize];
        if let Some(run) = &member.locked_by {
            return Readiness::Wait {
                wake: None,
                message: format!("waiting: update run {run:?} is upgrading this member"),
                reason: WaitReason::Lock,
            };
        }
        let cluster = &member.cluster;
        // A freeze is looked at before the version and the window (SEMANTICS §12): both it and
        // the window must allow a start.
        let rollback_to = self.rollback.targets.get(&m);
        if !self.freezes.is_empty() {
            let target = match rollback_to {
                Some(before) => Some(before.kubernetes_version),
                None => self
                    .upgrade
                    .kubernetes_version
                    .filter(|_| self.upgrade.changes_kubernetes()),
            };
            let changes_minor =
                target.is_some_and(|v| v.minor_line() != cluster.kubernetes_version.minor_line());
            if let Some((freeze, until)) =
                self.freezes
                    .holding(&member.name, self.upgrade.upgrade_type, changes_minor, now)
            {
                return Readiness::Wait {
                    wake: Some(until),
                    message: freeze.message(until),
                    reason: WaitReason::Freeze,
                };
            }
        }
        let region = cluster.region.as_str();
        let mut needs = Availability::Now;
        let mut what = String::new();
        // A rollback goes back to what the cluster ran: no release is waited for (§15).
        let upgrades = rollback_to.is_none();
        if upgrades
            && self.upgrade.changes_kubernetes()
            && let Some(v) = self.upgrade.kubernetes_version
        {
            let a = self.catalog.kubernetes(region, v, now);
            if a != Availability::Now {
                what = format!("Kubernetes version {v} is not yet available in region {region:?}");
            }
            needs = needs.and(a);
            // A chain also needs a patch of every minor on the way (SEMANTICS §13).
            if let Some((a, missing)) = self.intermediate_availability(cluster, now) {
                if a != Availability::Now && what.is_empty() {
                    what = missing;
                }
                needs = needs.and(a);
            }
        }
        if upgrades && self.upgrade.changes_node_images() {
            for pool in &cluster.node_pools {
                let a = match &self.upgrade.node_images {
                    NodeImageSelection::Latest => {
                        self.catalog.first_image_arrival(region, &pool.family, now)
                    }
                    NodeImageSelection::Consistent => match self
                        .selected_images
                        .as_ref()
                        .and_then(|s| s.get(&pool.family))
                    {
                        Some(v) => self.catalog.image(region, &pool.family, v, now),
                        // No selection for this family: decided (Skipped) when picked.
                        None => Availability::Now,
                    },
                    NodeImageSelection::Custom(versions) => match versions.get(&pool.family) {
                        Some(v) => self.catalog.image(region, &pool.family, v, now),
                        None => Availability::Now,
                    },
                };
                if a != Availability::Now && what.is_empty() {
                    what = format!(
                        "no node image of family {} is available yet in region {region:?}",
                        pool.family
                    );
                    if let NodeImageSelection::Custom(versions) = &self.upgrade.node_images
                        && let Some(v) = versions.get(&pool.family)
                    {
                        what = format!(
                            "target node image version {}-{v} is not yet available in region {region:?}",
                            pool.family
                        );
                    }
                }
                needs = needs.and(a);
            }
        }
        let earliest = match needs {
            Availability::Now => now,
            Availability::At(t) => t,
            Availability::Unlisted => {
                return Readiness::Wait {
                    wake: None,
                    message: format!("{what}; waiting for it to be released there"),
                    reason: WaitReason::Version,
                };
            }
        };
        let Some(window) = self.window_of(cluster) else {
            if earliest > now {
                return Readiness::Wait {
                    wake: Some(earliest),
                    message: format!("{what}; expected at {earliest}"),
                    reason: WaitReason::Version,
                };
            }
            return Readiness::Ready;
        };
        match window.next_opening(earliest) {
            None => Readiness::Wait {
                wake: None,
                message: "the maintenance window never opens again".into(),
                reason: WaitReason::Window,
            },
            Some(o) if o.from == now => Readiness::Ready,
            Some(o) => {
                let message = if earliest > now {
                    format!(
                        "{what}; expected at {earliest}, then the maintenance window opens at {}",
                        o.from
                    )
                } else if o.from.unix() - now.unix() <= SOON {
                    format!("maintenance window opens soon, at {}", o.from)
                } else {
                    format!("maintenance window is closed; it opens next at {}", o.from)
                };
                Readiness::Wait {
                    wake: Some(o.from),
                    message,
                    // A target not yet in the region is waited for first.
                    reason: if earliest > now {
                        WaitReason::Version
                    } else {
                        WaitReason::Window
                    },
                }
            }
        }
    }

    /// What to do with a member the run has reached (SEMANTICS §1): upgrade, skip (already at
    /// target, no Consistent image), or fail (downgrade).
    pub(super) fn decide(&self, m: u32, now: Time) -> Decision {
        let member = &self.members[m as usize];
        if member.removed {
            return Decision::Skip(REMOVED.into());
        }
        if let Some(before) = self.rollback.targets.get(&m) {
            // A rollback run: its target is its state before the original run (§15).
            return self.decide_rollback(m, before, now);
        }
        let cluster = &member.cluster;
        let current = cluster.kubernetes_version;
        let kube_target = if self.upgrade.changes_kubernetes() {
            self.upgrade.kubernetes_version
        } else {
            None
        };
        if let Some(target) = kube_target {
            if self.rules.skip_minor_jumps
                && target.major == current.major
                && target.minor > current.minor + 1
            {
                return Decision::Skip(format!(
                    "the cluster is more than one minor behind the target ({}.{} → {}.{}); auto-upgrade does not skip minors",
                    current.major, current.minor, target.major, target.minor
                ));
            }
            if self.rules.require_long_term_support
                && !cluster.long_term_support
                && target != current
            {
                return Decision::Fail {
                    code: "LongTermSupportRequired",
                    message: format!(
                        "target Kubernetes version {target} is kept only by long-term support, which this cluster does not have enabled"
                    ),
                };
            }
        }
        if let Some(target) = kube_target
            && target < current
        {
            return Decision::Fail {
                code: "DowngradeNotSupported",
                message: format!(
                    "target Kubernetes version {target} is lower than the cluster's current version {current}; downgrades are not supported"
                ),
            };
        }
        let mut node_images = Vec::new();
        let mut left_alone = Vec::new();
        // A Latest pool whose family has no image in the region yet is not at target: the
        // member waits for one (readiness), then is decided again with the image it got.
        let mut awaiting_image = false;
        if self.upgrade.changes_node_images() {
            for pool in &cluster.node_pools {
                if self.rules.linux_node_pools_only && pool.os == Os::Windows {
                    left_alone.push(format!("{:?}", pool.name));
                    continue;
                }
                let chosen = match &self.upgrade.node_images {
                    NodeImageSelection::Latest => {
                        let newest = self
                            .catalog
                            .newest_image(&cluster.region, &pool.family, now)
                            .cloned();
                        awaiting_image |= newest.is_none();
                        newest
                    }
                    NodeImageSelection::Consistent => {
                        match self
                            .selected_images
                            .as_ref()
                            .and_then(|s| s.get(&pool.family))
                        {
                            Some(v) => Some(v.clone()),
                            None => {
                                return Decision::Skip(format!(
                                    "node pool {:?} uses image family {}, which has no version available in every region of this run (Consistent selection)",
                                    pool.name, pool.family
                                ));
                            }
                        }
                    }
                    NodeImageSelection::Custom(versions) => versions.get(&pool.family).cloned(),
                };
                if let Some(image) = chosen
                    && image > pool.image
                {
                    node_images.push(PoolTarget {
                        pool: pool.name.clone(),
                        family: pool.family.clone(),
                        image,
                    });
                }
            }
        }
        let kube_change = kube_target.filter(|t| *t != current);
        if let Some(message) = kube_change.and_then(|t| self.skew_failure(cluster, t)) {
            return Decision::Fail {
                code: "NodePoolVersionSkew",
                message,
            };
        }
        if kube_change.is_none() && node_images.is_empty() && !awaiting_image {
            if !left_alone.is_empty() {
                return Decision::Skip(format!(
                    "Windows node pool(s) {} skipped: security patches cover Linux node pools only; no Linux node pool needs an update",
                    left_alone.join(", ")
                ));
            }
            let what = match self.upgrade.upgrade_type {
                UpgradeType::ControlPlaneOnly => format!("already at Kubernetes version {current}"),
                UpgradeType::NodeImageOnly => {
                    "every node pool is already at or ahead of its target node image".into()
                }
                UpgradeType::Full => {
                    format!(
                        "already at Kubernetes version {current} with every node pool at or ahead of its target node image"
                    )
                }
            };
            return Decision::Skip(what);
        }
        Decision::Upgrade(Target {
            upgrade_type: self.upgrade.upgrade_type,
            kubernetes_version: kube_target,
            node_images,
            rollback: None,
        })
    }

    // -----------------------------------------------------------------------------------------
    // Scheduling.
}
