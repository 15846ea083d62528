//! A fleet's rules across its runs as stored (SEMANTICS §12): its freezes, read by the fleet's
//! task when it starts and whenever they change, and by the `freezes` resource.

use flotilla_engine::freeze::{Freeze, FreezeSpec, parse_freeze};
use serde_json::Value;

use crate::store::{Kind, Store, StoreResult};

/// The most freezes a fleet holds (each is looked at for every member a run reaches).
pub const MOST_FREEZES: usize = 100;

/// A fleet's freezes, as stored and parsed; one that no longer parses is left out.
pub async fn freezes_of(store: &dyn Store, fleet: &str) -> StoreResult<Vec<Freeze>> {
    Ok(store
        .list(fleet, Kind::Freeze, None, MOST_FREEZES + 1)
        .await?
        .into_iter()
        .filter_map(|r| from_body(&r.name, &r.body))
        .collect())
}

/// A stored freeze's body, parsed.
pub fn from_body(name: &str, body: &Value) -> Option<Freeze> {
    let spec: FreezeSpec = serde_json::from_value(body["properties"].clone()).ok()?;
    parse_freeze(name, &spec).ok()
}
