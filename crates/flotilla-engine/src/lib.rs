//! Flotilla's engine: the domain model of fleets, strategies and update runs, their validation,
//! and the pure, deterministic state machine that decides what an update run does next.
//!
//! Nothing here performs I/O or reads a clock: time is an input ([`time::Time`]). The simulator,
//! the server and the tests all drive [`engine::Engine`] through the same door.

pub mod body;
pub mod budget;
pub mod checks;
pub mod engine;
pub mod error;
pub mod fleet;
pub mod fleet_engine;
pub mod forecast;
pub mod freeze;
pub mod profile;
pub mod release;
pub mod selector;
pub mod status;
pub mod strategy;
pub mod threshold;
pub mod time;
pub mod train;
pub mod version;
pub mod window;

pub use engine::{
    Command, Engine, GateRef, Input, OperationProgress, RunSpec, SkipKind, SkipTarget, Target,
    Timing,
};
pub use error::{ApiError, ErrorCode};
pub use fleet_engine::{FleetCommand, FleetEngine, FleetEvent, FleetInput};
pub use status::{Event, EventType, State, UpdateRunStatus};
pub use time::Time;
