//! Disruption budgets in a run (SEMANTICS §12): a member that could otherwise be sent its
//! upgrade now waits while a partition it is in has as many members in flight, across the
//! fleet's runs, as the budget allows.
//!
//! The counts come from the fleet engine before each of the run's turns; the run adds its own
//! starts as it makes them, so the runs of a pass, served oldest first, share the places. A
//! held member is parked and indexed by the partition that holds it. It is reached again when
//! its group is handed a slot while that partition has a free place: the group's next member
//! is then the first of its queue or of its members parked on a partition with room,
//! whichever comes first in the group's order (`budget_candidate`). So a place that frees
//! costs the member that takes it; the members still held are not touched, and a group with
//! no free slot leaves its held members as they are (Pending, as SEMANTICS §12 has them until
//! they are reached).

use super::*;

impl Engine {
    /// The partition that holds member `m` now, if any: the first of its partitions that is
    /// full.
    pub(super) fn budget_hold(&self, m: u32) -> Option<u32> {
        let b = &self.budget;
        if b.view.is_empty() {
            return None;
        }
        b.view
            .partitions_of(&self.members[m as usize].name)
            .iter()
            .copied()
            .find(|&p| {
                let limit = b.view.partitions[p as usize].limit;
                b.in_flight.get(p as usize).copied().unwrap_or_default() >= limit
            })
    }

    /// The partitions with members parked on them that have a free place now (in this run's
    /// view): a skip over the parked index, one seek per partition holding members.
    pub(super) fn budget_open(&self) -> Vec<u32> {
        let b = &self.budget;
        let mut open = Vec::new();
        let mut next = b.parked.first().map(|k| k.0);
        while let Some(p) = next {
            let limit = b.view.partitions.get(p as usize).map(|part| part.limit);
            let in_flight = b.in_flight.get(p as usize).copied().unwrap_or_default();
            if limit.is_some_and(|limit| in_flight < limit) {
                open.push(p);
            }
            next = p
                .checked_add(1)
                .and_then(|q| b.parked.range((q, 0, 0, 0)..).next())
                .map(|k| k.0);
        }
        open
    }

    /// The first member of group `g` (in the group's order: class, then member) parked on one
    /// of the `open` partitions: the member the group reaches next if it comes before the
    /// first of the group's queue.
    pub(super) fn budget_candidate(&self, g: u32, open: &[u32]) -> Option<(u8, u32)> {
        open.iter()
            .filter_map(|&p| {
                self.budget
                    .parked
                    .range((p, g, 0, 0)..=(p, g, u8::MAX, u32::MAX))
                    .next()
                    .map(|&(_, _, class, m)| (class, m))
            })
            .min()
    }

    /// Whether a member nothing else holds may start, as its budgets say.
    pub(super) fn budget_readiness(&self, m: u32, now: Time) -> Readiness {
        let Some(p) = self.budget_hold(m) else {
            return Readiness::Ready;
        };
        let b = &self.budget;
        let in_flight = b.in_flight.get(p as usize).copied().unwrap_or_default();
        let message = b.view.message(p, in_flight);
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

    /// A member leaves the parked index (queued, reached, parked for something else, or out
    /// of the group's walk).
    pub(super) fn budget_unindex(&mut self, m: u32) {
        if let Some((p, class)) = self.budget.held.remove(&m) {
            let g = self.members[m as usize].group;
            self.budget.parked.remove(&(p, g, class, m));
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

    /// The counts in flight changed: a partition with fewer serves the members it holds as
    /// their groups are handed slots (at the settle that follows).
    pub(super) fn budget_room(&mut self, counts: Vec<u64>) {
        if counts.len() == self.budget.in_flight.len() {
            self.budget.in_flight = counts;
        }
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
