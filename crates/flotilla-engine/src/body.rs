//! The API's request bodies as the server reads them, before any validation: JSON that refuses
//! a key given twice, the resource envelope around `properties`, and the `properties` of
//! strategies and runs. Here, not in the server, so that the fuzz targets read bodies exactly as
//! the server does.

use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, ErrorCode, from_json_value};

/// Parses JSON refusing a key given twice in one object (serde_json keeps the last, so two
/// readers of one body could see two different requests).
pub fn strict_json(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    use serde::de::{DeserializeSeed, Error, MapAccess, SeqAccess, Visitor};
    struct Strict;
    impl<'de> DeserializeSeed<'de> for Strict {
        type Value = Value;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(Strict)
        }
    }
    impl<'de> Visitor<'de> for Strict {
        type Value = Value;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E: Error>(self, v: f64) -> Result<Value, E> {
            serde_json::Number::from_f64(v)
                .map(Value::Number)
                .ok_or_else(|| E::custom("a number that is not finite"))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_string()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element_seed(Strict)? {
                items.push(item);
            }
            Ok(Value::Array(items))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut object = serde_json::Map::new();
            while let Some(key) = map.next_key::<String>()? {
                if object.contains_key(&key) {
                    return Err(A::Error::custom(format!(
                        "the key {key:?} is given twice in one object"
                    )));
                }
                let value = map.next_value_seed(Strict)?;
                object.insert(key, value);
            }
            Ok(Value::Object(object))
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = Strict.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// Envelope fields a client may send back unchanged; only `properties` is read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, bound = "P: serde::de::DeserializeOwned")]
pub struct Envelope<P> {
    #[serde(default)]
    pub properties: Option<P>,
    #[serde(default, rename = "id")]
    _id: Option<Value>,
    #[serde(default, rename = "name")]
    _name: Option<Value>,
    #[serde(default, rename = "type")]
    _type: Option<Value>,
    #[serde(default, rename = "eTag")]
    _etag: Option<Value>,
    #[serde(default, rename = "systemData")]
    _system: Option<Value>,
}

/// The `properties` of a resource body; a body without them is refused.
pub fn properties<P: serde::de::DeserializeOwned>(value: Value) -> Result<P, ApiError> {
    let env: Envelope<P> = from_json_value(value, "")?;
    env.properties.ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidRequestContent,
            "properties is required",
            "properties",
        )
    })
}

/// `properties` of an update strategy.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StrategyProperties {
    pub strategy: Option<Value>,
    #[serde(default, rename = "provisioningState")]
    _state: Option<Value>,
}

/// `properties` of an update run.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunProperties {
    #[serde(default)]
    pub update_strategy_id: Option<String>,
    #[serde(default)]
    pub strategy: Option<Value>,
    pub managed_cluster_update: Option<Value>,
    /// SEMANTICS §13: a target more than one minor ahead is reached one minor at a time.
    #[serde(default)]
    pub chain_minor_versions: bool,
    #[serde(default, rename = "provisioningState")]
    _state: Option<Value>,
    #[serde(default, rename = "status")]
    _status: Option<Value>,
    #[serde(default, rename = "autoUpgradeProfileId")]
    _profile: Option<Value>,
    /// Read-only (SEMANTICS §15): a rollback run is made by `POST …/rollback`, never written
    /// or cloned; [`RunProperties::check_read_only`] refuses a body that sets it.
    #[serde(default)]
    pub rollback_of: Option<Value>,
    #[serde(default)]
    pub rolled_back_by: Option<Value>,
}

impl RunProperties {
    /// Refuses what only the server writes: a run's rollback run (`rolledBackBy`) and a
    /// rollback run's origin (`rollbackOf`), SEMANTICS §15.
    pub fn check_read_only(&self) -> Result<(), ApiError> {
        let written = [
            ("rollbackOf", &self.rollback_of),
            ("rolledBackBy", &self.rolled_back_by),
        ];
        match written.into_iter().find(|(_, v)| v.is_some()) {
            Some((field, Some(value))) => Err(ApiError::new(
                ErrorCode::InvalidRequestContent,
                format!(
                    "properties.{field} {value}: read-only; a rollback run is made only by POST …/updateRuns/{{run}}/rollback, and cannot be written or cloned"
                ),
                format!("properties.{field}"),
            )),
            _ => Ok(()),
        }
    }
}
