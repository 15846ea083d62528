//! Chained minor upgrades (SEMANTICS §13): in a run with `chainMinorVersions`, a Full or
//! ControlPlaneOnly target more than one minor ahead of a member is reached one minor at a
//! time. Each *hop* is one driver operation with its own attempt (recorded as intended before
//! it is sent, like any upgrade); the hops of an attempt run back to back in the member's slot,
//! the member Running, disrupted and holding its cluster from its first hop to the end of its
//! last. Between two hops the member is *between*: its last hop succeeded and the next is not
//! sent yet; it is due (`hops_due`) when something may let it go (its hop just ended, a timer,
//! readiness passing, the catalog or the freezes changing), and the next settle decides.

use serde::{Deserialize, Serialize};

use super::*;
use crate::status::Hop;

/// A member's hops in this run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Chain {
    /// Every hop sent to the member in this run, retries included, in order.
    #[serde(rename = "h")]
    pub(super) hops: Vec<Hop>,
    /// Hops sent in the member's current attempt.
    #[serde(rename = "n")]
    pub(super) sent: u32,
    /// Its last hop succeeded and the next is not sent yet.
    #[serde(rename = "b", default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) between: bool,
}

/// How many hops take `from` to `target`: one per minor (one when the minor stays).
fn hops_between(from: KubeVersion, target: Option<KubeVersion>) -> u32 {
    match target {
        Some(target) if target.major == from.major && target.minor > from.minor => {
            target.minor - from.minor
        }
        _ => 1,
    }
}

/// What holds a hop back, and until when (`None`: until an input says otherwise).
struct Hold {
    wake: Option<Time>,
    why: String,
    readiness: bool,
}

impl Engine {
    /// Whether this run sends its upgrades as hops.
    pub(super) fn chains(&self) -> bool {
        self.rules.chain_minor_versions && self.upgrade.changes_kubernetes()
    }

    /// The minor after the cluster's, when the run's target is further than that (a hop to an
    /// intermediate version is needed); `None` when the next hop goes to the target.
    fn next_line(&self, from: KubeVersion) -> Option<(u32, u32)> {
        let target = self.upgrade.kubernetes_version?;
        (self.chains() && target.major == from.major && target.minor > from.minor + 1)
            .then_some((from.major, from.minor + 1))
    }

    /// How many hops take `from` to the run's target: one per minor.
    fn hops_left(&self, from: KubeVersion) -> u32 {
        hops_between(from, self.upgrade.kubernetes_version)
    }

    /// Where the next hop from `cluster` goes at `now`: the newest generally available patch of
    /// the next minor in its region, or the run's target when it is at most one minor ahead;
    /// `Err(minor)` when that minor has no such patch there now.
    fn hop_version(&self, cluster: &Cluster, now: Time) -> Result<KubeVersion, (u32, u32)> {
        let from = cluster.kubernetes_version;
        match self.next_line(from) {
            Some(line) => self
                .catalog
                .newest_patch(&cluster.region, line, cluster.long_term_support, now)
                .ok_or(line),
            None => Ok(self.upgrade.kubernetes_version.unwrap_or(from)),
        }
    }

    /// A chain starts only when every intermediate minor has a generally available patch in
    /// the member's region: when the first one missing arrives, and what it is.
    pub(super) fn intermediate_availability(
        &self,
        cluster: &Cluster,
        now: Time,
    ) -> Option<(Availability, String)> {
        let first = self.next_line(cluster.kubernetes_version)?;
        let target = self.upgrade.kubernetes_version?;
        let mut needs = Availability::Now;
        let mut what = None;
        for minor in first.1..target.minor {
            let line = (first.0, minor);
            let a =
                self.catalog
                    .patch_arrival(&cluster.region, line, cluster.long_term_support, now);
            if a != Availability::Now && what.is_none() {
                what = Some(format!(
                    "a generally available patch of Kubernetes {}.{} (an intermediate minor of the chain to {target}) is not yet available in region {:?}",
                    line.0, line.1, cluster.region
                ));
            }
            needs = needs.and(a);
        }
        Some((needs, what.unwrap_or_default()))
    }

    /// A ControlPlaneOnly chain keeps every node pool within 3 minors of the control plane
    /// (AKS's skew rule), decided against the whole chain: the pool that would fall behind.
    pub(super) fn skew_failure(&self, cluster: &Cluster, target: KubeVersion) -> Option<String> {
        if !self.chains() || self.upgrade.upgrade_type != UpgradeType::ControlPlaneOnly {
            return None;
        }
        let pool = cluster.node_pools.iter().find(|p| {
            let v = p.kubernetes_version(cluster);
            v.major == target.major && target.minor > v.minor + 3
        })?;
        Some(format!(
            "node pool {:?} runs Kubernetes {}; a ControlPlaneOnly chain to {target} would leave it more than 3 minors behind the control plane, which AKS does not allow; upgrade the pool first or use a Full upgrade",
            pool.name,
            pool.kubernetes_version(cluster)
        ))
    }

    fn hop_label(&self, m: u32, from: KubeVersion, to: KubeVersion) -> String {
        let sent = self.chains.get(&m).map_or(0, |c| c.sent);
        format!(
            "hop {} of {}: {from} → {to}",
            sent + 1,
            sent + self.hops_left(from)
        )
    }

    /// The first hop of an attempt: `target` (the decision's, to the run's target) goes to the
    /// first hop's version instead. Readiness made sure each intermediate minor has a patch now.
    pub(super) fn first_hop(&mut self, now: Time, m: u32, mut target: Target) -> Target {
        let chain = self.chains.entry(m).or_default();
        chain.sent = 0;
        chain.between = false;
        if let Ok(to) = self.hop_version(&self.members[m as usize].cluster, now) {
            target.kubernetes_version = Some(to);
        }
        target
    }

    /// Records and sends a hop: its attempt, its command, its event.
    pub(super) fn send_hop(&mut self, now: Time, m: u32, target: Target) {
        let from = self.members[m as usize].cluster.kubernetes_version;
        let to = target.kubernetes_version.unwrap_or(from);
        let label = self.hop_label(m, from, to);
        self.touch(m);
        self.set_member_timer(m, None);
        self.end_watch(Subject::Readiness(m));
        let member = &mut self.members[m as usize];
        member.message = Some(label.as_str().into());
        let chain = self.chains.entry(m).or_default();
        chain.sent += 1;
        chain.between = false;
        chain.hops.push(Hop {
            from,
            to,
            start_time: now,
            completed_time: None,
            state: State::Running,
        });
        self.send_operation(m, target);
        self.emit_member(now, EventType::MemberHopStarted, m, Some(label));
    }

    /// Member `m`'s hop in flight ended: recorded, with its event. True when it succeeded and
    /// the chain goes on (it did not reach the run's target).
    pub(super) fn end_hop(&mut self, now: Time, m: u32, outcome: &Result<(), String>) -> bool {
        let target = self.upgrade.kubernetes_version;
        let Some(chain) = self.chains.get_mut(&m) else {
            return false;
        };
        let Some(hop) = chain.hops.last_mut() else {
            return false;
        };
        hop.completed_time = Some(now);
        hop.state = if outcome.is_ok() {
            State::Completed
        } else {
            State::Failed
        };
        let more = outcome.is_ok() && Some(hop.to) != target;
        let label = format!(
            "hop {} of {}: {} → {}",
            chain.sent,
            chain.sent - 1 + hops_between(hop.from, target),
            hop.from,
            hop.to
        );
        if !more {
            // The chain ends: the member's message is its outcome's, not the hop's.
            self.members[m as usize].message = None;
        }
        let (kind, message) = match outcome {
            Ok(()) => (EventType::MemberHopSucceeded, label),
            Err(why) => (EventType::MemberHopFailed, format!("{label} failed: {why}")),
        };
        self.emit_member(now, kind, m, Some(message));
        more
    }

    /// The error of a member whose hop failed names the hop.
    pub(super) fn hop_failure(&self, m: u32, why: String) -> String {
        match self
            .chains
            .get(&m)
            .and_then(|c| Some((c.sent, c.hops.last()?)))
        {
            Some((k, hop)) if self.chains() => format!(
                "hop {k} of the chain ({} → {}) failed: {why}; the cluster stays at {}",
                hop.from, hop.to, hop.from
            ),
            _ => why,
        }
    }

    /// A hop succeeded and others follow: the member is between hops, due to go on at the
    /// next settle (or, once its run failed, Stopped where it is).
    pub(super) fn hop_succeeded(&mut self, m: u32) {
        let member = &mut self.members[m as usize];
        if let Some(target) = &member.target {
            apply_target(Arc::make_mut(&mut member.cluster), target);
        }
        if let Some(chain) = self.chains.get_mut(&m) {
            chain.between = true;
        }
        self.hops_due.insert(m);
    }

    /// Members between hops that are due: each sends its next hop, or waits for what holds it
    /// with a message naming it (SEMANTICS §13), or ends. True if any was due.
    pub(super) fn continue_chains(&mut self, now: Time) -> bool {
        if self.hops_due.is_empty() {
            return false;
        }
        for m in std::mem::take(&mut self.hops_due) {
            self.next_hop(now, m);
        }
        true
    }

    fn next_hop(&mut self, now: Time, m: u32) {
        let member = &self.members[m as usize];
        if member.state != State::Running || !self.is_between(m) {
            return;
        }
        if member.removed {
            // Deleted from the fleet: Skipped, as when its operation ends (SEMANTICS §2).
            self.end_between(m);
            let g = self.members[m as usize].group;
            self.add_in_flight(g, -1);
            self.groups[g as usize].unfinished -= 1;
            self.end_removed(now, m, g);
            return;
        }
        if self.phase != RunPhase::Running {
            // The run failed (§4): no further hop; the member ends where it is.
            self.end_between(m);
            let g = self.members[m as usize].group;
            self.add_in_flight(g, -1);
            let member = &mut self.members[m as usize];
            let message = format!(
                "stopped at Kubernetes {}: the run failed, so no further hop is sent",
                member.cluster.kubernetes_version
            );
            member.state = State::Stopped;
            member.message = Some(message.as_str().into());
            self.emit_member(now, EventType::MemberStopped, m, Some(message));
            return;
        }
        let mut target = match self.decide(m, now) {
            Decision::Upgrade(target) => target,
            Decision::Skip(why) => {
                // At its target already: done.
                self.end_between(m);
                let g = self.members[m as usize].group;
                self.add_in_flight(g, -1);
                self.groups[g as usize].unfinished -= 1;
                let member = &mut self.members[m as usize];
                member.state = State::Completed;
                member.completed = Some(now);
                member.message = Some(why.as_str().into());
                self.emit_member(now, EventType::MemberSucceeded, m, Some(why));
                self.finish_group_if_skipped(now, g);
                return;
            }
            Decision::Fail { code, message } => {
                self.fail_between(now, m, code, message);
                return;
            }
        };
        let cluster = self.members[m as usize].cluster.clone();
        let to = self.hop_version(&cluster, now);
        if let Some(hold) = self.hop_hold(m, &cluster, to, now) {
            let shown = match to {
                Ok(to) => self.hop_label(m, cluster.kubernetes_version, to),
                Err((major, minor)) => {
                    format!("next hop: {} → {major}.{minor}", cluster.kubernetes_version)
                }
            };
            let message = format!("{shown} waits: {}", hold.why);
            if self.members[m as usize].message.as_deref() != Some(message.as_str()) {
                self.touch(m);
                self.members[m as usize].message = Some(message.into());
            }
            self.set_member_timer(m, hold.wake);
            if hold.readiness {
                self.ensure_readiness(now, m);
            } else {
                self.end_watch(Subject::Readiness(m));
            }
            return;
        }
        if let Ok(to) = to {
            target.kubernetes_version = Some(to);
        }
        self.send_hop(now, m, target);
    }

    /// What holds the next hop of a member between hops (SEMANTICS §13): a freeze, the hop's
    /// version not in the region, the maintenance window, then readiness checks. Budgets do not.
    fn hop_hold(
        &self,
        m: u32,
        cluster: &Cluster,
        to: Result<KubeVersion, (u32, u32)>,
        now: Time,
    ) -> Option<Hold> {
        let member = &self.members[m as usize];
        let from = cluster.kubernetes_version;
        if !self.freezes.is_empty() {
            let changes_minor = match to {
                Ok(to) => to.minor_line() != from.minor_line(),
                Err(_) => true,
            };
            if let Some((freeze, until)) =
                self.freezes
                    .holding(&member.name, self.upgrade.upgrade_type, changes_minor, now)
            {
                return Some(Hold {
                    wake: Some(until),
                    why: freeze.message(until),
                    readiness: false,
                });
            }
        }
        let region = cluster.region.as_str();
        let (arrival, missing) = match to {
            Err(line) => (
                self.catalog
                    .patch_arrival(region, line, cluster.long_term_support, now),
                format!(
                    "no generally available patch of Kubernetes {}.{} is available in region {region:?}",
                    line.0, line.1
                ),
            ),
            Ok(to) => (
                self.catalog.kubernetes(region, to, now),
                format!("Kubernetes version {to} is not available in region {region:?}"),
            ),
        };
        match arrival {
            Availability::Now => {}
            Availability::At(t) => {
                return Some(Hold {
                    wake: Some(t),
                    why: format!("{missing}; expected at {t}"),
                    readiness: false,
                });
            }
            Availability::Unlisted => {
                return Some(Hold {
                    wake: None,
                    why: format!("{missing}; waiting for it to be released there"),
                    readiness: false,
                });
            }
        }
        if let Some(window) = self.window_of(cluster) {
            match window.next_opening(now) {
                None => {
                    return Some(Hold {
                        wake: None,
                        why: "the maintenance window never opens again".into(),
                        readiness: false,
                    });
                }
                Some(o) if o.from > now => {
                    return Some(Hold {
                        wake: Some(o.from),
                        why: format!("maintenance window is closed; it opens next at {}", o.from),
                        readiness: false,
                    });
                }
                Some(_) => {}
            }
        }
        match self.readiness_checks(m, now) {
            None | Some(Readiness::Ready) => None,
            Some(Readiness::Wait { .. }) => {
                let why = self
                    .readiness_failure(m)
                    .unwrap_or_else(|| "readiness checks being evaluated".into());
                Some(Hold {
                    wake: None,
                    why,
                    readiness: true,
                })
            }
        }
    }

    /// Leaves the between-hops state without sending a hop: the member lets its cluster go.
    pub(super) fn end_between(&mut self, m: u32) {
        let Some(chain) = self.chains.get_mut(&m).filter(|c| c.between) else {
            return;
        };
        chain.between = false;
        let member = &self.members[m as usize];
        self.released.push((member.name.clone(), member.attempt));
        self.hops_due.remove(&m);
        self.touch(m);
        self.set_member_timer(m, None);
        self.end_watch(Subject::Readiness(m));
    }

    /// A member between hops fails where it is (its readiness checks timed out, say).
    pub(super) fn fail_between(&mut self, now: Time, m: u32, code: &str, message: String) {
        self.end_between(m);
        let g = self.members[m as usize].group;
        self.add_in_flight(g, -1);
        self.groups[g as usize].unfinished -= 1;
        self.fail_member(now, m, code, message);
    }

    /// Whether member `m` is between two hops.
    pub(super) fn is_between(&self, m: u32) -> bool {
        self.chains.get(&m).is_some_and(|c| c.between)
    }

    /// The hop in flight (or re-attached to) of member `m`, if it has one.
    pub(super) fn hop_in_flight(&mut self, m: u32) -> Option<&mut Hop> {
        self.chains
            .get_mut(&m)?
            .hops
            .last_mut()
            .filter(|h| h.completed_time.is_none())
    }

    /// The recorded hops of member `m` (its status's `hops`).
    pub(super) fn hops_of(&self, m: u32) -> Vec<Hop> {
        self.chains
            .get(&m)
            .map_or_else(Vec::new, |c| c.hops.clone())
    }

    /// The chain's own invariants: no hop skips a minor, and a member between hops is in
    /// flight with no operation of its own.
    pub(super) fn check_chains(&self) -> Result<(), String> {
        for (&m, chain) in &self.chains {
            let Some(member) = self.members.get(m as usize) else {
                return Err(format!("a chain names member {m}, not in the run"));
            };
            for hop in &chain.hops {
                if hop.to.major == hop.from.major && hop.to.minor > hop.from.minor + 1 {
                    return Err(format!(
                        "member {}: hop {} → {} skips a minor",
                        member.name, hop.from, hop.to
                    ));
                }
            }
            if chain.between
                && (member.state != State::Running || member.verifying || member.reattaching)
            {
                return Err(format!(
                    "member {} is between hops but {:?}",
                    member.name, member.state
                ));
            }
        }
        Ok(())
    }
}
