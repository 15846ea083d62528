//! The API error object (`{"code", "message", "target"}`, SEMANTICS §9) shared by validation
//! and by the engine's refusals of user actions.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Machine-readable error codes. The HTTP status follows from the code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    InvalidRequestContent,
    UnknownField,
    InvalidName,
    InvalidMaxConcurrency,
    InvalidMaxAllowedFailures,
    InvalidMemberSelector,
    InvalidStrategy,
    InvalidGate,
    InvalidHealthCheck,
    InvalidCheckProvider,
    InvalidFreeze,
    InvalidDisruptionBudget,
    InvalidUpgrade,
    InvalidKubernetesVersion,
    InvalidNodeImageSelection,
    InvalidMaintenanceWindow,
    DuplicateMembership,
    InvalidSkipTarget,
    /// The action does not fit the current state (HTTP 409).
    Conflict,
    NotFound,
    /// The caller's role does not allow this action (HTTP 403).
    Forbidden,
}

impl ErrorCode {
    /// The HTTP status this code is answered with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::Conflict => 409,
            ErrorCode::NotFound => 404,
            ErrorCode::Forbidden => 403,
            _ => 400,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// The JSON path of the offending field (`properties.strategy.stages[1].groups[0].maxConcurrency`).
    #[serde(default)]
    pub target: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>, target: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            target: target.into(),
        }
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::Conflict, message, "")
    }

    /// Prefixes the target with an enclosing path (`properties.strategy` + `stages[0]`).
    pub fn within(mut self, prefix: &str) -> ApiError {
        if prefix.is_empty() {
            return self;
        }
        self.target = if self.target.is_empty() {
            prefix.to_string()
        } else if self.target.starts_with('[') {
            format!("{prefix}{}", self.target)
        } else {
            format!("{prefix}.{}", self.target)
        };
        self
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

/// Deserializes JSON into `T`, rejecting unknown fields and naming the path of any problem.
pub fn from_json_value<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    root: &str,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Strict(value)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let mut target = match (root.is_empty(), path.as_str()) {
            (_, ".") => root.to_string(),
            (true, p) => p.to_string(),
            (false, p) => format!("{root}.{p}"),
        };
        // serde names an unknown field in its message; the target should point at it.
        if let Some(field) = inner
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
            && !target.ends_with(field)
        {
            target = if target.is_empty() {
                field.to_string()
            } else {
                format!("{target}.{field}")
            };
        }
        let code = if inner.starts_with("unknown field") {
            ErrorCode::UnknownField
        } else {
            ErrorCode::InvalidRequestContent
        };
        let message = if target.is_empty() {
            inner
        } else {
            format!("{target}: {inner}")
        };
        ApiError::new(code, message, target)
    })
}

/// A JSON value read the way a person writing a body expects: an object where the API wants an
/// object. serde's derived structs also take an array (`[{...}]` read as `{"stages": {...}}`),
/// which turned a stages file written as a bare array into
/// `properties.strategy.[0]: invalid type: map, expected a sequence` (or accepted it silently);
/// here anything but an object given for one is refused, saying what the object looks like.
struct Strict(serde_json::Value);

/// What an object of the API looks like, for a message about a value that is not one: the
/// shapes people get wrong by name, any other by its fields.
fn object_shape(name: &str, fields: &[&str]) -> String {
    match name {
        "StrategySpec" => r#"an object {"stages": [...]}, each stage {"name": "...", "groups": [{"name": "..."}]} (a stages file is that object, not a bare array of stages)"#.to_string(),
        "ScheduleSpec" => r#"a schedule object with one of daily, weekly, absoluteMonthly or relativeMonthly, such as {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}} or {"daily": {"intervalDays": 1}} (cron expressions are not a schedule)"#.to_string(),
        "MaintenanceWindowSpec" => r#"a maintenance window object such as {"schedule": {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}}, "durationHours": 4, "startTime": "00:00", "utcOffset": "+00:00"}"#.to_string(),
        _ if fields.is_empty() => "an object".to_string(),
        _ => format!("an object with the fields {}", fields.join(", ")),
    }
}

/// A value as a message names it: `an array`, `the string "0 3 * * 1"`, `the number 5`.
fn described(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => {
            let short: String = s.chars().take(60).collect();
            let more = if short.len() < s.len() { "…" } else { "" };
            format!("the string {short:?}{more}")
        }
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

struct StrictSeq(std::vec::IntoIter<serde_json::Value>);

impl<'de> serde::de::SeqAccess<'de> for StrictSeq {
    type Error = serde_json::Error;
    fn next_element_seed<T: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(Strict(v)))
            .transpose()
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct StrictMap {
    entries: serde_json::map::IntoIter,
    value: Option<serde_json::Value>,
}

impl<'de> serde::de::MapAccess<'de> for StrictMap {
    type Error = serde_json::Error;
    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.entries.next() {
            Some((key, value)) => {
                self.value = Some(value);
                seed.deserialize(serde_json::Value::String(key)).map(Some)
            }
            None => Ok(None),
        }
    }
    fn next_value_seed<V: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let value = self.value.take().unwrap_or(serde_json::Value::Null);
        seed.deserialize(Strict(value))
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

impl Strict {
    fn seq<'de, V: serde::de::Visitor<'de>>(
        items: Vec<serde_json::Value>,
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        let len = items.len();
        let mut seq = StrictSeq(items.into_iter());
        let value = visitor.visit_seq(&mut seq)?;
        if seq.0.len() == 0 {
            Ok(value)
        } else {
            Err(serde::de::Error::invalid_length(len, &"fewer elements"))
        }
    }

    fn map<'de, V: serde::de::Visitor<'de>>(
        object: serde_json::Map<String, serde_json::Value>,
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        let len = object.len();
        let mut map = StrictMap {
            entries: object.into_iter(),
            value: None,
        };
        let value = visitor.visit_map(&mut map)?;
        if map.entries.len() == 0 {
            Ok(value)
        } else {
            Err(serde::de::Error::invalid_length(len, &"fewer entries"))
        }
    }
}

macro_rules! strict_forward {
    ($($method:ident)*) => {
        $(
            fn $method<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                serde::Deserializer::$method(self.0, visitor)
            }
        )*
    };
}

impl<'de> serde::Deserializer<'de> for Strict {
    type Error = serde_json::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        use serde_json::Value;
        match self.0 {
            Value::Array(items) => Strict::seq(items, visitor),
            Value::Object(object) => Strict::map(object, visitor),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            serde_json::Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Strict(other)),
        }
    }

    fn deserialize_newtype_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            serde_json::Value::Array(items) => Strict::seq(items, visitor),
            other => other.deserialize_seq(visitor),
        }
    }

    fn deserialize_tuple<V: serde::de::Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            serde_json::Value::Object(object) => Strict::map(object, visitor),
            other => other.deserialize_map(visitor),
        }
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            serde_json::Value::Object(object) => Strict::map(object, visitor),
            other => Err(serde::de::Error::custom(format!(
                "expected {}, not {}",
                object_shape(name, fields),
                described(&other)
            ))),
        }
    }

    fn deserialize_enum<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_unit_struct<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_ignored_any<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    strict_forward! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_identifier
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read only through Debug
    struct Pair {
        a: Option<u32>,
        b: Option<Vec<String>>,
    }

    /// An array where an object is wanted is refused, never read field by field, and the
    /// message says what the object looks like.
    #[test]
    fn an_array_is_not_an_object() {
        let e = from_json_value::<Pair>(json!([1, ["x"]]), "properties").unwrap_err();
        assert_eq!(e.target, "properties");
        assert_eq!(
            e.message,
            "properties: expected an object with the fields a, b, not an array"
        );
        assert_eq!(e.code, ErrorCode::InvalidRequestContent);
        let e = from_json_value::<Vec<Pair>>(json!([{"a": 1}, "b"]), "").unwrap_err();
        assert_eq!(e.target, "[1]");
        assert!(e.message.contains("not the string \"b\""), "{}", e.message);
    }

    /// What reads well keeps reading: objects, options, sequences, numbers, unknown fields.
    #[test]
    fn objects_still_read_and_unknown_fields_are_named() {
        let p: Pair = from_json_value(json!({"a": 7, "b": ["x", "y"]}), "").expect("reads");
        assert_eq!(
            format!("{p:?}"),
            r#"Pair { a: Some(7), b: Some(["x", "y"]) }"#
        );
        let p: Pair = from_json_value(json!({"a": null}), "").expect("reads");
        assert_eq!(format!("{p:?}"), "Pair { a: None, b: None }");
        let e = from_json_value::<Pair>(json!({"c": 1}), "x").unwrap_err();
        assert_eq!(
            (e.code, e.target.as_str()),
            (ErrorCode::UnknownField, "x.c")
        );
        let e = from_json_value::<Pair>(json!({"a": "7"}), "").unwrap_err();
        assert_eq!(e.target, "a");
        let v: serde_json::Value = from_json_value(json!({"k": [1, {"z": null}]}), "").unwrap();
        assert_eq!(v, json!({"k": [1, {"z": null}]}));
    }

    /// A stages file written as a bare array, and a cron expression given for a maintenance
    /// window or its schedule: each says what the API wants there, naming the field and the
    /// value, and none is accepted.
    #[test]
    fn bare_stages_and_cron_windows_say_what_is_expected() {
        use crate::strategy::StrategySpec;
        use crate::window::MaintenanceWindowSpec;
        let e = from_json_value::<StrategySpec>(
            json!([{"name": "canary", "groups": [{"name": "canary"}]}]),
            "properties.strategy",
        )
        .unwrap_err();
        assert_eq!(e.target, "properties.strategy");
        assert!(
            e.message
                .starts_with(r#"properties.strategy: expected an object {"stages": [...]}"#)
                && e.message.ends_with("not an array"),
            "{}",
            e.message
        );
        // Not even a bare array of arrays, which serde would read as {"stages": [...]}.
        assert!(
            from_json_value::<StrategySpec>(json!([[{"name": "s"}]]), "properties.strategy")
                .is_err()
        );
        let e = from_json_value::<MaintenanceWindowSpec>(
            json!({"schedule": "0 3 * * 1", "durationHours": 4}),
            "properties.maintenance.kubernetes",
        )
        .unwrap_err();
        assert_eq!(e.target, "properties.maintenance.kubernetes.schedule");
        assert!(
            e.message
                .contains(r#"{"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}}"#)
                && e.message.contains(r#"not the string "0 3 * * 1""#)
                && !e.message.contains("ScheduleSpec"),
            "{}",
            e.message
        );
        let e =
            from_json_value::<MaintenanceWindowSpec>(json!("0 3 * * 1"), "recurrence").unwrap_err();
        assert!(
            e.message
                .starts_with("recurrence: expected a maintenance window object")
                && !e.message.contains("struct"),
            "{}",
            e.message
        );
    }
}
