//! Disruption budgets in a run (SEMANTICS §12): a member that could otherwise be sent its
//! upgrade now waits while a partition it is in has as many members in flight, across the
//! fleet's runs, as the budget allows.
//!
//! The counts come from the fleet engine before each of the run's turns; the run adds its own
//! starts as it makes them, so the runs of a pass, served oldest first, share the places. A
//! held member is parked and indexed by the partition that holds it. When a partition has free
//! places, the first members parked on it in each group (in the group's order) are queued again,
//! as many as there are places, and *reserve* them until their group reaches them: a member
//! still parked is held as long as the free places of its partition are reserved in its group.
//! So a place that frees costs the members it can serve, not every member held.

use super::*;

impl Engine {
    /// The partition that holds member `m` now, if any: one that is full or, for a member
    /// parked, one whose free places are reserved by members of its group queued before it.
    pub(super) fn budget_hold(&self, m: u32) -> Option<u32> {
        let b = &self.budget;
        if b.view.is_empty() {
            return None;
        }
        let member = &self.members[m as usize];
        let parked = member.place == Place::Parked;
        b.view
            .partitions_of(&member.name)
            .iter()
            .copied()
            .find(|&p| {
                let limit = b.view.partitions[p as usize].limit;
                let in_flight = b.in_flight.get(p as usize).copied().unwrap_or_default();
                in_flight >= limit
                    || (parked
                        && b.reserved_count
                            .get(&(p, member.group))
                            .is_some_and(|&r| r >= limit - in_flight))
            })
    }

    /// Whether a member nothing else holds may start, as its budgets say.
    pub(super) fn budget_readiness(&self, m: u32, now: Time) -> Readiness {
        let Some(p) = self.budget_hold(m) else {
            return Readiness::Ready;
        };
        let b = &self.budget;
        let in_flight = b.in_flight.get(p as usize).copied().unwrap_or_default();
        let mut message = b.view.message(p, in_flight);
        if in_flight < b.view.partitions[p as usize].limit {
            message.push_str("; its free places go to members queued before this one");
        }
        Readiness::Wait {
            // Reached again when its window closes (then the window holds it first).
            wake: self.class_of(m, now).1,
            message,
            reason: WaitReason::Budget,
        }
    }

    /// The budget holding a Pending member, for its `waitingFor`.
    pub(super) fn budget_name(&self, m: u32) -> Option<String> {
        let p = self.budget.held.get(&m)?.0;
        Some(self.budget.view.partitions.get(p as usize)?.budget.clone())
    }

    /// A member was parked (for `reason`): indexed under the partition holding it if that is a
    /// budget.
    pub(super) fn budget_parked(&mut self, now: Time, m: u32, reason: WaitReason) {
        self.budget_unindex(m);
        if reason != WaitReason::Budget {
            return;
        }
        if let Some(p) = self.budget_hold(m) {
            let class = self.class_of(m, now).0;
            let g = self.members[m as usize].group;
            self.budget.parked.insert((p, g, class, m));
            self.budget.held.insert(m, (p, class));
        }
    }

    /// A member leaves the parked index, and lets go of its reservation if it held one (its
    /// places may serve others), unless it is about to start (`starts`: it takes them).
    pub(super) fn budget_unindex(&mut self, m: u32) {
        if let Some((p, class)) = self.budget.held.remove(&m) {
            let g = self.members[m as usize].group;
            self.budget.parked.remove(&(p, g, class, m));
        }
    }

    pub(super) fn budget_unreserve(&mut self, m: u32, starts: bool) {
        if !self.budget.reserved.remove(&m) {
            return;
        }
        let g = self.members[m as usize].group;
        let view = self.budget.view.clone();
        for &p in view.partitions_of(&self.members[m as usize].name) {
            if let Some(r) = self.budget.reserved_count.get_mut(&(p, g)) {
                *r -= 1;
                if *r == 0 {
                    self.budget.reserved_count.remove(&(p, g));
                }
            }
            if !starts {
                self.budget.opened.insert(p);
            }
        }
    }

    /// Queues again, in each group, the first members parked on each partition that has free
    /// places not yet reserved there; they reserve the places until their group reaches them.
    pub(super) fn release_budgets(&mut self, now: Time) -> bool {
        if self.phase != RunPhase::Running {
            self.budget.opened.clear();
            return false;
        }
        let mut changed = false;
        while let Some(p) = self.budget.opened.pop_first() {
            let Some(part) = self.budget.view.partitions.get(p as usize) else {
                continue;
            };
            let in_flight = self.budget.in_flight[p as usize];
            if in_flight >= part.limit {
                continue;
            }
            let free = part.limit - in_flight;
            let mut next = (p, 0, 0, 0);
            while let Some(&(_, g, _, _)) = self.budget.parked.range(next..(p + 1, 0, 0, 0)).next()
            {
                let reserved = self
                    .budget
                    .reserved_count
                    .get(&(p, g))
                    .copied()
                    .unwrap_or_default();
                let take: Vec<u32> = self
                    .budget
                    .parked
                    .range((p, g, 0, 0)..(p, g + 1, 0, 0))
                    .take(free.saturating_sub(reserved) as usize)
                    .map(|k| k.3)
                    .collect();
                for m in take {
                    self.enqueue(now, m);
                    self.budget_reserve(m);
                    changed = true;
                }
                next = (p, g + 1, 0, 0);
            }
        }
        changed
    }

    fn budget_reserve(&mut self, m: u32) {
        if !self.budget.reserved.insert(m) {
            return;
        }
        let g = self.members[m as usize].group;
        let view = self.budget.view.clone();
        for &p in view.partitions_of(&self.members[m as usize].name) {
            *self.budget.reserved_count.entry((p, g)).or_default() += 1;
        }
    }

    /// Member `m` begins (a start, a re-attach) or ends counting against the budgets: the
    /// fleet engine takes it; a start counts in this run's own view at once.
    pub(super) fn budget_disruption(&mut self, m: u32, begins: bool) {
        let name = self.members[m as usize].name.clone();
        if begins {
            let view = self.budget.view.clone();
            for &p in view.partitions_of(&name) {
                if let Some(n) = self.budget.in_flight.get_mut(p as usize) {
                    *n += 1;
                }
            }
        }
        self.disruptions.push((name, begins));
    }

    /// The fleet's budgets changed: every member held is decided again on the new partitions.
    pub(super) fn budgets_changed(&mut self, now: Time, view: Arc<crate::budget::Budgets>) {
        self.budget = BudgetState {
            in_flight: view.in_flight.clone(),
            view,
            ..BudgetState::default()
        };
        self.repark_waiting(now);
    }

    /// The counts in flight changed: the partitions with fewer serve the members they hold.
    pub(super) fn budget_room(&mut self, counts: Vec<u64>) {
        if counts.len() != self.budget.in_flight.len() {
            return;
        }
        for (p, (new, old)) in counts.iter().zip(&self.budget.in_flight).enumerate() {
            if new < old {
                self.budget.opened.insert(p as u32);
            }
        }
        self.budget.in_flight = counts;
    }

    /// What the fleet engine takes after each of the run's inputs and turns.
    pub fn take_disruptions(&mut self) -> Vec<(Arc<str>, bool)> {
        std::mem::take(&mut self.disruptions)
    }

    /// The members in flight in this run now, which count against budgets (a run rebuilt from
    /// its log): from their start or re-attachment (not while the run asks whether an operation
    /// it stopped tracking still runs) to their end.
    pub fn disrupted_members(&self) -> impl Iterator<Item = &Arc<str>> {
        self.members
            .iter()
            .filter(|m| m.state == State::Running && !m.reattaching)
            .map(|m| &m.name)
    }

    /// The counts in flight this run decides on (the fleet's, plus its own starts since).
    pub fn budget_counts(&self) -> &[u64] {
        &self.budget.in_flight
    }

    /// Members held by a budget: the run is given the counts at its next turn even when
    /// nothing else happened to it.
    pub fn holds_for_budgets(&self) -> bool {
        !self.budget.parked.is_empty()
    }
}
