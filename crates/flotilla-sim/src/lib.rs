//! Scenario files and the virtual-time simulator that drives the Flotilla engine, plus the
//! human-readable rendering and the expectation checker of `flotilla simulate`.

pub mod check;
mod fleets;
pub mod render;
pub mod scenario;
pub mod simulator;

pub use scenario::{Scenario, ScenarioError};
pub use simulator::{SimResult, forecast_scenario, simulate};
