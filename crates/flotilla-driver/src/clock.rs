//! The wall clock the shell runs on, as the engine's [`Time`]. The engine itself never reads a
//! clock: the shell reads this one and hands the instant in.

use std::time::{SystemTime, UNIX_EPOCH};

use flotilla_engine::time::Time;

/// Now, to the second.
pub fn now() -> Time {
    Time::from_unix(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64),
    )
}
