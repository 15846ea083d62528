//! Fleet Manager's Azure Resource Manager paths (API.md, "Fleet Manager (ARM) paths"): the same
//! resources as `/v1`, so that the Azure SDKs, ARM templates and `az rest` scripts written for
//! Fleet Manager work unchanged.
//!
//! This is a thin shell around the `/v1` API, in one place: a request under
//! `/subscriptions/{sub}/…/fleets/{fleet}` is checked (its `api-version`, the fleet's
//! subscription and resource group), rewritten to its `/v1` path and served by the same handler;
//! the answer gets ARM ids, an absolute `nextLink` and the status codes of Fleet Manager's
//! swagger. The fleet lists of a subscription or resource group are answered here.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use flotilla_engine::strategy::check_name;

use crate::auth::Role;
use crate::error::HttpError;
use crate::home::{Arm, Home, Settings};
use crate::state::Shared;
use crate::store::Kind;

/// The fleet's children, by their ARM collection names, with the actions each takes (the CLI's
/// `-g` asks for the same at their ARM paths).
pub const COLLECTIONS: &[(&str, &[&str])] = &[
    ("members", &[]),
    ("updateRuns", &["start", "stop", "skip", "rollback"]),
    ("updateStrategies", &[]),
    ("autoUpgradeProfiles", &["generateUpdateRun"]),
    ("gates", &[]),
];

/// A fleet name no fleet has (it is not a valid name): where a request about a fleet of
/// another subscription or resource group is sent, to be refused as the handler refuses it.
const NO_FLEET: &str = "-";

/// The oldest Fleet Manager API version (API.md).
const OLDEST_API_VERSION: &str = "2023-03-15-preview";

/// What an ARM path names.
#[derive(Debug, PartialEq)]
enum Target {
    /// The fleets of a subscription, or of one of its resource groups.
    Fleets {
        subscription: String,
        resource_group: Option<String>,
    },
    /// A fleet or something in it: `rest` is the `/v1` path below the fleet, in canonical case.
    InFleet {
        subscription: String,
        resource_group: String,
        fleet: String,
        collection: Option<&'static str>,
        rest: String,
    },
}

fn same(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Parses a path under `/subscriptions/`; `None` when it is not one of Fleet Manager's.
fn parse(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let fixed = |at: usize, word: &str| parts.get(at).is_some_and(|p| same(p, word));
    if !fixed(0, "subscriptions") || parts.get(1).is_none_or(|s| s.is_empty()) {
        return None;
    }
    let subscription = parts[1].to_string();
    let (resource_group, at) = if fixed(2, "resourceGroups") {
        (Some(parts.get(3).filter(|g| !g.is_empty())?.to_string()), 4)
    } else {
        (None, 2)
    };
    if !(fixed(at, "providers")
        && fixed(at + 1, "Microsoft.ContainerService")
        && fixed(at + 2, "fleets"))
    {
        return None;
    }
    let rest = &parts[at + 3..];
    if rest.is_empty() {
        return Some(Target::Fleets {
            subscription,
            resource_group,
        });
    }
    let resource_group = resource_group?;
    // Names are lowercase in Flotilla, so a name in any case is that name. The fleet's is
    // checked here, before its home is: a name spelt otherwise (percent-encoded, say) would be
    // looked up as one fleet and served as another.
    let fleet = rest[0].to_ascii_lowercase();
    if check_name(&fleet, 63).is_err() || rest.len() > 4 {
        return None;
    }
    let mut below = String::new();
    let mut collection = None;
    if let Some(c) = rest.get(1) {
        let (name, actions) = COLLECTIONS.iter().find(|(n, _)| same(n, c))?;
        collection = Some(*name);
        below = format!("/{name}");
        if let Some(child) = rest.get(2) {
            if child.is_empty() {
                return None;
            }
            below.push('/');
            below.push_str(&child.to_ascii_lowercase());
        }
        if let Some(action) = rest.get(3) {
            let action = actions.iter().find(|a| same(a, action))?;
            below.push('/');
            below.push_str(action);
        }
    }
    Some(Target::InFleet {
        subscription,
        resource_group,
        fleet,
        collection,
        rest: below,
    })
}

/// The `api-version` of a query, required, and the rest of the query.
fn split_query(query: &str) -> Result<(String, String), HttpError> {
    let mut version = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("api-version") => {
                if version.replace(value.to_string()).is_some() {
                    return Err(HttpError::new(
                        StatusCode::BAD_REQUEST,
                        "InvalidApiVersionParameter",
                        "api-version is given more than once",
                    ));
                }
            }
            _ => rest.push(pair),
        }
    }
    let Some(version) = version.filter(|v| !v.is_empty()) else {
        return Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        ));
    };
    if !known_api_version(&version) {
        return Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            "InvalidApiVersionParameter",
            format!(
                "api-version {version:?}: must be a Fleet Manager API version, {OLDEST_API_VERSION} or later (YYYY-MM-DD or YYYY-MM-DD-preview)"
            ),
        ));
    }
    Ok((version, rest.join("&")))
}

fn known_api_version(v: &str) -> bool {
    let date = v.strip_suffix("-preview").unwrap_or(v);
    let shaped = date.len() == 10
        && date.char_indices().all(|(i, c)| match i {
            4 | 7 => c == '-',
            _ => c.is_ascii_digit(),
        });
    // Dates compare as text; a preview sorts after its stable date, as Azure orders them.
    shaped && v >= OLDEST_API_VERSION
}

/// The API's router with Fleet Manager's ARM paths around it: those are rewritten to their
/// `/v1` paths before routing, so the one router serves both.
pub fn router(state: Shared) -> axum::Router {
    axum::Router::new()
        .fallback_service(crate::api::router(state.clone()))
        .layer(axum::middleware::from_fn_with_state(state, layer))
}

/// The middleware: requests under `/subscriptions/` are Fleet Manager's; every other goes on.
pub async fn layer(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let prefix = b"/subscriptions/";
    let path = request.uri().path().as_bytes();
    if !(path.len() > prefix.len() && path[..prefix.len()].eq_ignore_ascii_case(prefix)) {
        return next.run(request).await;
    }
    match serve(&state, request, next).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

fn no_path(path: &str) -> HttpError {
    HttpError::new(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("no Fleet Manager resource at {path:?}"),
    )
}

async fn serve(state: &Shared, mut request: Request, next: Next) -> Result<Response, HttpError> {
    // Who asks, before anything is read: a stranger learns nothing of which fleets exist.
    let caller = crate::auth::authenticate(state, request.method(), request.headers()).await?;
    request.extensions_mut().insert(caller.clone());
    let path = request.uri().path().to_string();
    let target = parse(&path).ok_or_else(|| no_path(&path))?;
    let (version, query) = split_query(request.uri().query().unwrap_or_default())?;
    let settings = state.arm_settings();
    // Links name the server as users reach it (`--public-url`), else as this request did.
    let base = match &settings.public_url {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => format!(
            "{}://{}",
            if settings.https { "https" } else { "http" },
            request
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("localhost")
        ),
    };
    let link = Links {
        base,
        version,
        fleet: None,
    };
    let (subscription, resource_group, fleet, collection, rest) = match target {
        Target::Fleets {
            subscription,
            resource_group,
        } => {
            if request.method() != Method::GET {
                return Err(HttpError::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    format!(
                        "{} {path}: the fleets of a subscription are listed (GET)",
                        request.method()
                    ),
                ));
            }
            return list_fleets(
                state,
                request,
                next,
                &settings,
                &link,
                &subscription,
                resource_group.as_deref(),
                &query,
            )
            .await;
        }
        Target::InFleet {
            subscription,
            resource_group,
            fleet,
            collection,
            rest,
        } => (subscription, resource_group, fleet, collection, rest),
    };
    let stored = state.runs.store.get("", Kind::Fleet, &fleet).await?;
    let method = request.method().clone();
    let home = match &stored {
        Some(f) => Home::of(&f.body, &settings),
        None => Home {
            subscription: subscription.clone(),
            resource_group: resource_group.clone(),
        },
    };
    // A fleet of another subscription or resource group is not there. Its name is taken all
    // the same (fleet names are the server's): creating it here is a conflict.
    let foreign = !home.is(&subscription, Some(&resource_group));
    if foreign && method == Method::PUT && collection.is_none() {
        crate::auth::require(&caller, Role::Admin)?;
        return Err(HttpError::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "fleet name {fleet:?} is taken by a fleet of another subscription or resource group; fleet names are unique in a Flotilla server"
            ),
        ));
    }
    // Otherwise the request goes to a fleet that cannot exist: the handler checks the role,
    // and answers that nothing is there.
    let served = if foreign { NO_FLEET } else { fleet.as_str() };
    let uri = if query.is_empty() {
        format!("/v1/fleets/{served}{rest}")
    } else {
        format!("/v1/fleets/{served}{rest}?{query}")
    };
    *request.uri_mut() = uri.parse::<Uri>().map_err(|_| no_path(&path))?;
    request.extensions_mut().insert(Arm { home: home.clone() });
    let response = next.run(request).await;
    let status = response.status();
    if status == StatusCode::NOT_FOUND {
        // ARM: deleting what is not there succeeds.
        if method == Method::DELETE {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        if foreign {
            return Err(HttpError::new(
                StatusCode::NOT_FOUND,
                "ResourceNotFound",
                format!("fleet {fleet:?} was not found in this subscription and resource group"),
            ));
        }
    }
    // A deletion Fleet Manager's swagger lists no 200 for (auto-upgrade profiles) is 202.
    if method == Method::DELETE
        && status == StatusCode::OK
        && collection == Some("autoUpgradeProfiles")
    {
        return Ok(StatusCode::ACCEPTED.into_response());
    }
    let one = |name: &str| (name == fleet).then(|| home.clone());
    let link = Links {
        fleet: Some(fleet.clone()),
        ..link
    };
    arm_answer(response, &link, &one).await
}

/// How absolute links are made: the server's address and the request's `api-version`; and the
/// fleet the request is under, whose gates a run's status names by their bare ids.
struct Links {
    base: String,
    version: String,
    fleet: Option<String>,
}

/// `GET /subscriptions/{sub}[/resourceGroups/{rg}]/providers/Microsoft.ContainerService/fleets`:
/// the fleets of that home, a page at a time, by name.
#[allow(clippy::too_many_arguments)]
async fn list_fleets(
    state: &Shared,
    mut request: Request,
    next: Next,
    settings: &Settings,
    link: &Links,
    subscription: &str,
    resource_group: Option<&str>,
    query: &str,
) -> Result<Response, HttpError> {
    let uri: Uri = format!("/?{query}").parse().map_err(|_| {
        HttpError::new(
            StatusCode::BAD_REQUEST,
            "InvalidQueryParameter",
            format!("the query {query:?} is not a URI's query"),
        )
    })?;
    let paging = crate::api::Paging::of(&uri)?;
    let top = paging.top()?;
    let after = paging.skip_token.clone();
    // Authentication and the reader role: the same check as `/v1/fleets`, one page of one.
    *request.uri_mut() = Uri::from_static("/v1/fleets?$top=1");
    let probe = next.run(request).await;
    if !probe.status().is_success() {
        return Ok(probe);
    }
    let mut homes = std::collections::HashMap::new();
    let mut value = Vec::new();
    let mut next_token = None;
    let mut cursor = after;
    'pages: loop {
        let page = state
            .runs
            .store
            .list("", Kind::Fleet, cursor.as_deref(), 500)
            .await?;
        let Some(last) = page.last() else { break };
        cursor = Some(last.name.clone());
        for fleet in page {
            let home = Home::of(&fleet.body, settings);
            if !home.is(subscription, resource_group) {
                continue;
            }
            if value.len() == top {
                next_token = value
                    .last()
                    .and_then(|v: &Value| v["name"].as_str().map(String::from));
                break 'pages;
            }
            homes.insert(fleet.name.clone(), home);
            value.push(crate::api::present(fleet));
        }
    }
    let mut body = json!({"value": value});
    let of = |name: &str| homes.get(name).cloned();
    rewrite(&mut body, &of, link);
    if let Some(token) = next_token {
        let scope = match resource_group {
            Some(g) => format!("/subscriptions/{subscription}/resourceGroups/{g}"),
            None => format!("/subscriptions/{subscription}"),
        };
        body["nextLink"] = json!(format!(
            "{}{scope}/providers/Microsoft.ContainerService/fleets?api-version={}&$top={top}&$skipToken={token}",
            link.base, link.version
        ));
    }
    Ok(axum::Json(body).into_response())
}

/// A `/v1` answer made an ARM one: ids and links rewritten in a JSON body; anything else as is.
async fn arm_answer(
    response: Response,
    link: &Links,
    home_of: &(dyn Fn(&str) -> Option<Home> + Sync),
) -> Result<Response, HttpError> {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    if !is_json || !response.status().is_success() {
        return Ok(response);
    }
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.map_err(|e| {
        HttpError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            e.to_string(),
        )
    })?;
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return Ok(Response::from_parts(parts, Body::from(bytes)));
    };
    rewrite(&mut value, home_of, link);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(Response::from_parts(parts, Body::from(value.to_string())))
}

/// The fields that hold ids (API.md: `id`, `gateId`, `target.id`, `autoUpgradeProfileId`,
/// `updateStrategyId`; a release train's `upstream.profileId`, `promotedFrom.runId` and the
/// profile status's `validatedBy`; and `nextLink`). Only these are rewritten.
const ID_FIELDS: [&str; 7] = [
    "id",
    "gateId",
    "updateStrategyId",
    "autoUpgradeProfileId",
    "profileId",
    "runId",
    "validatedBy",
];

/// Fields whose values are the user's own (tags, labels, a driver's configuration...): never
/// rewritten, whatever they hold.
const USER_FIELDS: [&str; 6] = [
    "tags",
    "labels",
    "identity",
    "hubProfile",
    "driver",
    "memberSelector",
];

/// Every `/v1` id in a document's id fields made an ARM id (`home_of` gives each fleet's home;
/// a run status's bare `gateId` is a gate of the request's fleet), and `nextLink` made absolute
/// with the request's `api-version`.
fn rewrite(value: &mut Value, home_of: &(dyn Fn(&str) -> Option<Home> + Sync), link: &Links) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite(v, home_of, link)),
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match (key.as_str(), v) {
                    (k, _) if USER_FIELDS.contains(&k) => {}
                    ("nextLink", Value::String(s)) => {
                        let (path, query) = s.split_once('?').unwrap_or((s.as_str(), ""));
                        if let Some(id) = arm_id(path, home_of) {
                            let mut absolute =
                                format!("{}{id}?api-version={}", link.base, link.version);
                            if !query.is_empty() {
                                absolute.push('&');
                                absolute.push_str(query);
                            }
                            *s = absolute;
                        }
                    }
                    ("gateId", Value::String(id)) if !id.starts_with('/') => {
                        if let Some(fleet) = &link.fleet
                            && let Some(home) = home_of(fleet)
                        {
                            *id = format!("{}/gates/{id}", home.fleet_id(fleet));
                        }
                    }
                    (k, Value::String(s)) if ID_FIELDS.contains(&k) => {
                        if let Some(id) = arm_id(s, home_of) {
                            *s = id;
                        }
                    }
                    (_, v) => rewrite(v, home_of, link),
                }
            }
        }
        _ => {}
    }
}

/// `/v1/fleets/{fleet}/…` as an ARM id, when the fleet's home is known.
fn arm_id(s: &str, home_of: &(dyn Fn(&str) -> Option<Home> + Sync)) -> Option<String> {
    let rest = s.strip_prefix("/v1/fleets/")?;
    let (fleet, below) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let home = home_of(fleet)?;
    Some(format!("{}{below}", home.fleet_id(fleet)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_case_insensitively_and_become_v1_paths() {
        let t = parse(
            "/SUBSCRIPTIONS/s1/resourcegroups/RG/providers/microsoft.containerservice/Fleets/Fleet1/UPDATERUNS/r1/Start",
        );
        assert_eq!(
            t,
            Some(Target::InFleet {
                subscription: "s1".into(),
                resource_group: "RG".into(),
                fleet: "fleet1".into(),
                collection: Some("updateRuns"),
                rest: "/updateRuns/r1/start".into(),
            })
        );
        assert_eq!(
            parse("/subscriptions/s1/providers/Microsoft.ContainerService/fleets"),
            Some(Target::Fleets {
                subscription: "s1".into(),
                resource_group: None
            })
        );
        // A fleet needs its resource group; an action its collection's; no other provider.
        assert_eq!(
            parse("/subscriptions/s1/providers/Microsoft.ContainerService/fleets/f"),
            None
        );
        assert_eq!(
            parse(
                "/subscriptions/s/resourceGroups/g/providers/Microsoft.ContainerService/fleets/f/members/m/start"
            ),
            None
        );
        assert_eq!(
            parse("/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/fleets/f"),
            None
        );
        assert_eq!(
            parse(
                "/subscriptions/s/resourceGroups/g/providers/Microsoft.ContainerService/fleets/f/listCredentials"
            ),
            None
        );
    }

    #[test]
    fn api_version_is_required_and_from_fleet_managers_first_on() {
        assert_eq!(
            split_query("api-version=2026-06-01&$top=2").ok(),
            Some(("2026-06-01".into(), "$top=2".into()))
        );
        assert!(split_query("api-version=2023-03-15-preview").is_ok());
        assert!(split_query("api-version=2026-06-02-preview").is_ok());
        for bad in [
            "",
            "$top=2",
            "api-version=",
            "api-version=2022-01-01",
            "api-version=latest",
            "api-version=2026-06-01&api-version=2026-06-01",
        ] {
            assert!(split_query(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            split_query("").err().map(|e| e.code),
            Some("MissingApiVersionParameter".to_string())
        );
    }

    #[test]
    fn ids_and_links_are_rewritten_for_known_fleets_only() {
        let home = Home {
            subscription: "s".into(),
            resource_group: "g".into(),
        };
        let of = |f: &str| (f == "f1").then(|| home.clone());
        let link = Links {
            base: "https://h:1".into(),
            version: "2026-06-01".into(),
            fleet: Some("f1".into()),
        };
        let mut doc = json!({
            "value": [{"id": "/v1/fleets/f1/updateRuns/r", "properties": {
                "status": {"stages": [{"afterGates": [{"gateId": "g-1"}]}]},
                "labels": {"gateId": "x", "id": "/v1/fleets/f1/members/m"},
                "displayName": "/v1/fleets/f1/gates/g",
                "autoUpgradeProfileId": "/v1/fleets/f2/autoUpgradeProfiles/p",
                "updateStrategyId": "/v1/fleets/f1/updateStrategies/s",
                "clusterResourceId": "/subscriptions/x/resourceGroups/y/providers/Microsoft.ContainerService/managedClusters/c",
                "other": "/v1/fleets/f2/members/m"}}],
            "nextLink": "/v1/fleets/f1/updateRuns?$top=1&$skipToken=r",
        });
        rewrite(&mut doc, &of, &link);
        let prefix =
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.ContainerService/fleets/f1";
        assert_eq!(doc["value"][0]["id"], format!("{prefix}/updateRuns/r"));
        assert_eq!(
            doc["value"][0]["properties"]["updateStrategyId"],
            format!("{prefix}/updateStrategies/s")
        );
        assert_eq!(
            doc["value"][0]["properties"]["clusterResourceId"],
            "/subscriptions/x/resourceGroups/y/providers/Microsoft.ContainerService/managedClusters/c"
        );
        assert_eq!(
            doc["value"][0]["properties"]["other"],
            "/v1/fleets/f2/members/m"
        );
        // A fleet whose home is not known keeps its /v1 id; what users wrote stays as written.
        assert_eq!(
            doc["value"][0]["properties"]["autoUpgradeProfileId"],
            "/v1/fleets/f2/autoUpgradeProfiles/p"
        );
        assert_eq!(
            doc["value"][0]["properties"]["labels"],
            json!({"gateId": "x", "id": "/v1/fleets/f1/members/m"})
        );
        assert_eq!(
            doc["value"][0]["properties"]["displayName"],
            "/v1/fleets/f1/gates/g"
        );
        assert_eq!(
            doc["value"][0]["properties"]["status"]["stages"][0]["afterGates"][0]["gateId"],
            format!("{prefix}/gates/g-1")
        );
        assert_eq!(
            doc["nextLink"],
            format!("https://h:1{prefix}/updateRuns?api-version=2026-06-01&$top=1&$skipToken=r")
        );
    }
}
