//! The clock the shell runs on, as the engine's [`Time`]. The engine itself never reads a
//! clock: the shell reads this one and hands the instant in.
//!
//! It is the wall clock, unless a test installs a [`Virtual`] one for the whole process: then
//! time stands still while the server works and jumps, when the test says so, to the next
//! instant something waits for. That is how scenarios spanning days of virtual time run through
//! the real server in seconds (`tests/scenarios_through_the_server.rs`), with every decision
//! taken at the exact instant the simulator takes it.
//!
//! What the virtual clock needs from the server: every wait for an instant goes through
//! [`sleep_until`] or [`sleep`], and everything at work at an instant (a message on its way to a
//! fleet's task, a task following an upgrade) holds a [`Busy`] token, so the clock can tell
//! when the server has done all it will do at this instant ([`Virtual::settled`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, oneshot};

use flotilla_engine::time::Time;

/// Now, to the second.
pub fn now() -> Time {
    Time::from_unix(now_millis().div_euclid(1000))
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_millis() -> i64 {
    match installed() {
        Some(v) => v.lock().now,
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
    }
}

/// Milliseconds on a clock that never goes back: for how long something lasts (a simulated
/// upgrade). The virtual clock's own on a virtual clock.
pub fn monotonic_millis() -> i64 {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    match installed() {
        Some(v) => v.lock().now,
        None => ORIGIN
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as i64,
    }
}

/// Whether a virtual clock is installed.
pub fn is_virtual() -> bool {
    installed().is_some()
}

/// The order in which sleepers due at the same instant wake: what the drivers report (an
/// upgrade ending) before what the runs decide at that instant, as the simulator does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Driver,
    Engine,
}

/// Sleeps until `at` (an instant of [`now`]); returns the token that whoever slept is at work
/// again, to hold until it has done what it woke for. On a virtual clock the sleeper is
/// registered when this is called, not when the future is first polled: a caller can give up
/// its own token right after, and the clock never sees it idle and not yet waiting.
pub fn sleep_until(at: Time, phase: Phase) -> impl Future<Output = Busy> + Send + 'static {
    let registered = installed().map(|v| v.register(at.unix().saturating_mul(1000), phase));
    async move {
        match registered {
            Some(sleeper) => sleeper.wait().await,
            None => {
                let wait = at.unix().saturating_mul(1000).saturating_sub(now_millis());
                tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
                Busy(None)
            }
        }
    }
}

tokio::task_local! {
    /// The token of a task started with [`spawn`]: given up while it sleeps.
    static TASK: std::cell::RefCell<Option<Busy>>;
}

/// Sleeps for `wait`. In a task started with [`spawn`], the task counts as idle meanwhile.
pub async fn sleep(wait: Duration, phase: Phase) {
    let Some(v) = installed() else {
        tokio::time::sleep(wait).await;
        return;
    };
    let at = v
        .lock()
        .now
        .saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX));
    let held = TASK.try_with(|t| t.borrow_mut().take()).ok().flatten();
    let woke = v.sleep(at, phase, held).await;
    let _ = TASK.try_with(|t| *t.borrow_mut() = Some(woke));
}

/// Starts a task that works on behalf of the instant it was started at: the virtual clock does
/// not move on until it ends or sleeps.
pub fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let token = std::cell::RefCell::new(Some(busy()));
    tokio::spawn(TASK.scope(token, task))
}

/// For a task that holds `held` tokens (the messages of its batch): waits until something else
/// at work at this instant ends or reaches it, and says whether anything still was; false at
/// once on the wall clock, or when nothing else is at work. Its caller takes what reached it and
/// asks again: so everything that happens at one virtual instant is handled in one batch, as
/// the simulator handles it. A task that waits on the caller while holding a token (none does)
/// would only delay it: the wait gives up after a second of real time.
pub async fn others_at_work(held: usize) -> bool {
    let Some(v) = installed() else {
        return false;
    };
    let changed = v.changed.notified();
    tokio::pin!(changed);
    changed.as_mut().enable();
    if v.lock().busy <= held {
        return false;
    }
    tokio::time::timeout(Duration::from_secs(1), changed)
        .await
        .is_ok()
}

/// Marks work in progress at the current instant until dropped.
pub fn busy() -> Busy {
    Busy(installed().map(|v| {
        v.lock().busy += 1;
        v.clone()
    }))
}

/// Work in progress at the current instant (nothing on the wall clock).
#[must_use = "the clock moves on once this is dropped"]
pub struct Busy(Option<Arc<Virtual>>);

impl Busy {
    /// A token that holds nothing.
    pub fn none() -> Busy {
        Busy(None)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(v) = self.0.take() {
            let mut state = v.lock();
            state.busy = state.busy.saturating_sub(1);
            drop(state);
            v.changed.notify_waiters();
        }
    }
}

/// A sleeper on the virtual clock, registered. Dropped before it woke (the other branch of a
/// `select!` won), it leaves no sleeper behind; woken but dropped, its token goes with the
/// channel.
enum Sleeper {
    Due(Busy),
    Waiting {
        clock: Arc<Virtual>,
        key: (i64, Phase, u64),
        rx: oneshot::Receiver<Busy>,
    },
}

impl Sleeper {
    async fn wait(mut self) -> Busy {
        match &mut self {
            Sleeper::Due(busy) => std::mem::replace(busy, Busy(None)),
            // A sender dropped without a token: the clock was set again for another test.
            Sleeper::Waiting { rx, .. } => rx.await.unwrap_or(Busy(None)),
        }
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        if let Sleeper::Waiting { clock, key, .. } = self {
            clock.lock().sleepers.remove(key);
        }
    }
}

static VIRTUAL: OnceLock<Arc<Virtual>> = OnceLock::new();

fn installed() -> Option<&'static Arc<Virtual>> {
    VIRTUAL.get()
}

/// A virtual clock: for tests only, one per process.
pub struct Virtual {
    state: Mutex<State>,
    changed: Notify,
}

struct State {
    /// Milliseconds since the Unix epoch.
    now: i64,
    busy: usize,
    seq: u64,
    sleepers: BTreeMap<(i64, Phase, u64), oneshot::Sender<Busy>>,
}

/// Installs the virtual clock for the rest of the process, at `start`; later calls set it to
/// `start` again (a test running scenario after scenario, each with a server of its own that
/// has ended).
pub fn install_virtual(start: Time) -> Arc<Virtual> {
    let v = VIRTUAL.get_or_init(|| {
        Arc::new(Virtual {
            state: Mutex::new(State {
                now: 0,
                busy: 0,
                seq: 0,
                sleepers: BTreeMap::new(),
            }),
            changed: Notify::new(),
        })
    });
    {
        let mut state = v.lock();
        state.now = start.unix().saturating_mul(1000);
        state.sleepers.clear();
        state.busy = 0;
    }
    v.clone()
}

impl Virtual {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps until `at`, giving up `held` (the sleeper's token) only once it is registered, so
    /// the clock never sees it idle and not yet waiting.
    async fn sleep(self: &Arc<Self>, at: i64, phase: Phase, held: Option<Busy>) -> Busy {
        let sleeper = self.register(at, phase);
        drop(held);
        sleeper.wait().await
    }

    fn register(self: &Arc<Self>, at: i64, phase: Phase) -> Sleeper {
        let mut state = self.lock();
        if at <= state.now {
            state.busy += 1;
            return Sleeper::Due(Busy(Some(self.clone())));
        }
        let (tx, rx) = oneshot::channel();
        state.seq += 1;
        let key = (at, phase, state.seq);
        state.sleepers.insert(key, tx);
        Sleeper::Waiting {
            clock: self.clone(),
            key,
            rx,
        }
    }

    /// Now, on this clock.
    pub fn now(&self) -> Time {
        Time::from_unix(self.lock().now.div_euclid(1000))
    }

    /// Waits until nothing is at work at the current instant.
    pub async fn settled(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lock().busy == 0 {
                return;
            }
            changed.await;
        }
    }

    /// The earliest instant a sleeper waits for, in milliseconds.
    pub fn next_deadline(&self) -> Option<i64> {
        self.lock().sleepers.keys().next().map(|k| k.0)
    }

    /// Moves the clock to `at` (milliseconds; never backwards) without waking anyone.
    pub fn advance_to(&self, at: i64) {
        let mut state = self.lock();
        state.now = state.now.max(at);
    }

    /// Wakes the sleepers due now of the earliest phase due; how many woke.
    pub fn wake_due(self: &Arc<Self>) -> usize {
        let mut state = self.lock();
        let now = state.now;
        let Some(phase) = state
            .sleepers
            .keys()
            .filter(|k| k.0 <= now)
            .map(|k| k.1)
            .min()
        else {
            return 0;
        };
        let due: Vec<(i64, Phase, u64)> = state
            .sleepers
            .keys()
            .filter(|k| k.0 <= now && k.1 == phase)
            .copied()
            .collect();
        let mut woken = Vec::with_capacity(due.len());
        for key in &due {
            if let Some(tx) = state.sleepers.remove(key) {
                state.busy += 1;
                woken.push(tx);
            }
        }
        drop(state);
        let count = woken.len();
        for tx in woken {
            // A receiver gone: the token comes back and is dropped.
            let _ = tx.send(Busy(Some(self.clone())));
        }
        count
    }
}
