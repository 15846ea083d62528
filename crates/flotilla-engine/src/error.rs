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
    serde_path_to_error::deserialize(value).map_err(|e| {
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
