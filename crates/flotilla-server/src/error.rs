//! The HTTP error type: every refusal the API answers, as `{"error": {"code", "message",
//! "target"}}` with its status, from the engine's errors and the store's.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use flotilla_engine::error::ApiError;

use crate::store::StoreError;

/// An error answered as `{"error": {"code", "message", "target"}}` with its status.
#[derive(Debug)]
pub struct HttpError {
    pub(crate) status: StatusCode,
    pub(crate) code: String,
    pub(crate) message: String,
    pub(crate) target: String,
}

impl HttpError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> HttpError {
        HttpError {
            status,
            code: code.to_string(),
            message: message.into(),
            target: String::new(),
        }
    }

    /// The same error about an item of a batch: its target and message under `prefix`
    /// (`value[3].`).
    pub fn under(mut self, prefix: &str) -> HttpError {
        self.message = if self.target.is_empty() {
            format!("{}: {}", prefix.trim_end_matches('.'), self.message)
        } else if self.message.starts_with(&self.target) {
            format!("{prefix}{}", self.message)
        } else {
            format!("{prefix}{}: {}", self.target, self.message)
        };
        self.target = format!("{prefix}{}", self.target);
        self
    }
}

impl From<ApiError> for HttpError {
    fn from(error: ApiError) -> HttpError {
        let status =
            StatusCode::from_u16(error.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        let code = serde_json::to_value(error.code)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        HttpError {
            status,
            code,
            message: error.message,
            target: error.target,
        }
    }
}

impl From<StoreError> for HttpError {
    fn from(e: StoreError) -> HttpError {
        match e {
            StoreError::Precondition(m) => {
                HttpError::new(StatusCode::PRECONDITION_FAILED, "PreconditionFailed", m)
            }
            StoreError::Refused {
                field,
                conflict,
                message,
                ..
            } => {
                let (status, code) = if conflict {
                    (StatusCode::CONFLICT, "Conflict")
                } else {
                    (StatusCode::BAD_REQUEST, "InvalidRequestContent")
                };
                let mut error = HttpError::new(status, code, message);
                error.target = field.to_string();
                error
            }
            other => HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "StoreUnavailable",
                other.to_string(),
            ),
        }
    }
}

/// Seconds a client is asked to wait before sending a request answered 503 again: the store
/// could not be reached or ended the write (nothing was written, unless the message says it
/// cannot tell), which a moment later it usually does not.
const RETRY_AFTER_SECONDS: &str = "1";

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body =
            json!({"error": {"code": self.code, "message": self.message, "target": self.target}});
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

pub type HttpResult<T> = Result<T, HttpError>;

pub fn unauthorized(message: &str) -> HttpError {
    HttpError::new(StatusCode::UNAUTHORIZED, "Unauthorized", message)
}

#[cfg(test)]
mod tests {
    use super::HttpError;
    use crate::store::StoreError;
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;

    #[test]
    fn a_write_the_database_ended_is_a_503_to_send_again() {
        let response = HttpError::from(StoreError::Busy(
            "the database ended the registration's transaction 3 times; nothing was written: send it again".into(),
        ))
        .into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response
                .headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
    }
}
