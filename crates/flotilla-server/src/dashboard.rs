//! The web dashboard: hand-written HTML, CSS and JavaScript modules embedded in the binary and
//! served at `/` and `/ui/{asset}` without authentication. The page holds no data; everything it
//! shows comes from the API with the bearer token the user signs in with.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use flotilla_engine::error::{ApiError, ErrorCode};

use crate::error::HttpError;

/// Scripts, styles and connections from this server only, no inline script or style, no
/// framing: the page can only talk to the API it came from.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

const JS: &str = "text/javascript; charset=utf-8";

/// Every asset under `/ui/`: name, content type, bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../ui/style.css"),
    ),
    ("app.js", JS, include_str!("../ui/app.js")),
    ("api.js", JS, include_str!("../ui/api.js")),
    ("dom.js", JS, include_str!("../ui/dom.js")),
    ("fleet.js", JS, include_str!("../ui/fleet.js")),
    ("runs.js", JS, include_str!("../ui/runs.js")),
    ("run.js", JS, include_str!("../ui/run.js")),
    ("checks.js", JS, include_str!("../ui/checks.js")),
    ("trains.js", JS, include_str!("../ui/trains.js")),
    ("icon.svg", "image/svg+xml", include_str!("../ui/icon.svg")),
];

const INDEX: &str = include_str!("../ui/index.html");

fn page(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Assets change with the binary; revalidating each load keeps an upgraded server's page
    // consistent with its API.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `GET /`: the single page.
pub async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{asset}`: one embedded asset, or 404.
pub async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => page(content_type, body),
        None => HttpError::from(ApiError::new(
            ErrorCode::NotFound,
            format!("the dashboard has no asset {name:?}"),
            "asset",
        ))
        .into_response(),
    }
}

/// Whether a path is the dashboard's (served without a token).
pub fn is_dashboard_path(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_assets_that_exist() {
        for reference in INDEX.split("/ui/").skip(1) {
            let name = reference
                .split(['"', '\''])
                .next()
                .unwrap_or_default()
                .to_string();
            assert!(
                ASSETS.iter().any(|(n, _, _)| *n == name),
                "index.html loads /ui/{name}, which is not embedded"
            );
        }
    }

    #[test]
    fn modules_import_only_embedded_modules() {
        for (name, _, body) in ASSETS.iter().filter(|(n, _, _)| n.ends_with(".js")) {
            for line in body.lines().filter(|l| l.starts_with("import ")) {
                let target = line
                    .rsplit("from")
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .trim_matches([' ', '\'', '"', ';'])
                    .trim_start_matches("./");
                assert!(
                    ASSETS.iter().any(|(n, _, _)| *n == target),
                    "{name} imports {target:?}, which is not embedded"
                );
            }
        }
    }
}
