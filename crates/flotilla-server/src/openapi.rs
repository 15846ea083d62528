//! `/openapi.json`: the OpenAPI 3 description of the routes of the route table (`ROUTES` in api.rs), with the
//! request and response schema of each and every status code it answers with. What a route
//! takes and answers follows from its method and its path's last segments, decided here once.

use serde_json::{Map, Value, json};

/// What a route is about, read from its method and path.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// A resource of the API (`Fleet`, `Member`, ...), named by its schema.
    Resource(&'static str),
    /// A page of resources.
    List(&'static str),
    /// An action on a run or a profile (`start`, `stop`, `skip`, `generateUpdateRun`).
    Action(&'static str),
    /// A fixed answer of its own schema (`Me`, `Leases`, `Releases`, ...).
    Other(&'static str),
    /// Plain text (`/metrics`, `/healthz`, `/readyz`).
    Text,
    /// The dashboard's pages and assets.
    Page,
    /// A step of the dashboard's sign-in: a redirect, or a refusal in plain text.
    Redirect,
    /// The dashboard's sign-out.
    SignOut,
}

/// The schema of a resource kind, by the path segment that names its collection.
fn resource_of(collection: &str) -> Option<&'static str> {
    Some(match collection {
        "fleets" => "Fleet",
        "members" => "Member",
        "updateStrategies" => "UpdateStrategy",
        "updateRuns" => "UpdateRun",
        "gates" => "Gate",
        "autoUpgradeProfiles" => "AutoUpgradeProfile",
        "tokens" => "Token",
        "webhooks" => "Webhook",
        "checkProviders" => "CheckProvider",
        "identityProviders" => "IdentityProvider",
        "freezes" => "Freeze",
        "disruptionBudgets" => "DisruptionBudget",
        _ => return None,
    })
}

fn shape(path: &str) -> Shape {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let last = segments.last().copied().unwrap_or_default();
    let named = last.starts_with('{');
    let parent = segments
        .len()
        .checked_sub(2)
        .and_then(|i| segments.get(i))
        .copied()
        .unwrap_or_default();
    if path.starts_with("/auth/") {
        return match last {
            "providers" => Shape::Other("AuthProviders"),
            "session" => Shape::Other("AuthSession"),
            "logout" => Shape::SignOut,
            _ => Shape::Redirect,
        };
    }
    match last {
        "" | "{asset}" => return Shape::Page,
        "metrics" | "healthz" | "readyz" => return Shape::Text,
        "openapi.json" => return Shape::Other("OpenApi"),
        "me" => return Shape::Other("Me"),
        "leases" => return Shape::Other("Leases"),
        "audit" => return Shape::Other("Audit"),
        "deliveries" => return Shape::Other("Deliveries"),
        "releases" => return Shape::Other("Releases"),
        "events" => return Shape::Other("Events"),
        "importMembers" => return Shape::Other("ImportResult"),
        "discoverMembers" => return Shape::Other("DiscoverResult"),
        "start" | "stop" | "skip" | "rollback" => return Shape::Action("UpdateRun"),
        "generateUpdateRun" => return Shape::Other("GeneratedRun"),
        "forecast" => return Shape::Other("Forecast"),
        _ => {}
    }
    if named {
        resource_of(parent).map_or(Shape::Page, Shape::Resource)
    } else {
        resource_of(last).map_or(Shape::Page, Shape::List)
    }
}

fn reference(schema: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{schema}")})
}

fn json_content(schema: Value) -> Value {
    json!({"application/json": {"schema": schema}})
}

fn answer(description: &str, schema: Option<Value>) -> Value {
    match schema {
        Some(schema) => json!({"description": description, "content": json_content(schema)}),
        None => json!({"description": description}),
    }
}

fn error(description: &str) -> Value {
    answer(description, Some(reference("Error")))
}

/// The body a route takes, if any: its schema, and whether it may be left out.
fn request_body(method: &str, path: &str, shape: Shape) -> Option<(Value, bool)> {
    match (method, shape) {
        ("put", Shape::Resource(schema)) => Some((reference(schema), true)),
        ("patch", Shape::Resource("Gate")) => Some((reference("GatePatch"), true)),
        ("patch", Shape::Resource("Member")) => Some((reference("MemberPatch"), true)),
        ("patch", Shape::Resource("Fleet")) => Some((reference("FleetPatch"), true)),
        ("post", Shape::List("Token")) => Some((reference("TokenRequest"), true)),
        ("post", Shape::Other("ImportResult")) => Some((reference("MemberImport"), true)),
        ("post", Shape::Other("Forecast")) if !path.contains("/updateRuns/") => {
            Some((reference("WhatIfForecastRequest"), true))
        }
        ("post", Shape::Other("Forecast")) => Some((reference("ForecastRequest"), false)),
        // Actions are sent with no body, as the Azure SDK sends them; skip names its targets.
        ("post", Shape::Action(_)) if path.ends_with("/skip") => {
            Some((reference("SkipRequest"), true))
        }
        ("post", Shape::Action(_)) => Some((json!({"type": "object"}), false)),
        _ => None,
    }
}

/// Every status a route answers with: what it does, then what any route of its kind may meet.
fn responses(method: &str, role: &str, shape: Shape, body: bool) -> Map<String, Value> {
    let mut out = Map::new();
    let mut put = |code: u16, value: Value| {
        out.insert(code.to_string(), value);
    };
    match (method, shape) {
        ("get", Shape::Resource(schema)) => {
            put(200, answer("The resource", Some(reference(schema))));
            put(404, error("It does not exist"));
        }
        ("get", Shape::List(schema)) => {
            put(
                200,
                answer(
                    "A page of them",
                    Some(
                        json!({"type": "object", "required": ["value"], "properties": {
                        "value": {"type": "array", "items": reference(schema)},
                        "nextLink": {"type": "string"}}}),
                    ),
                ),
            );
            if schema != "Token" {
                put(400, error("A paging or filter parameter is invalid"));
            }
            if !matches!(
                schema,
                "Token" | "Webhook" | "CheckProvider" | "IdentityProvider"
            ) {
                put(404, error("The fleet does not exist"));
            }
        }
        // Check providers live outside fleets; a change of type, or a delete, while a strategy
        // or a run that is not over names one is a conflict.
        ("put", Shape::Resource("CheckProvider")) => {
            put(200, answer("Replaced", Some(reference("CheckProvider"))));
            put(201, answer("Created", Some(reference("CheckProvider"))));
            put(
                409,
                error("Its type changes while a strategy or run names it"),
            );
            put(412, error("If-Match or If-None-Match does not hold"));
        }
        ("delete", Shape::Resource("CheckProvider")) => {
            put(200, answer("Deleted", None));
            put(404, error("It does not exist"));
            put(409, error("A strategy or a run that is not over names it"));
            put(412, error("If-Match does not hold"));
        }
        // Identity providers live outside fleets; those of the configuration file are read-only.
        ("put", Shape::Resource("IdentityProvider")) => {
            put(200, answer("Replaced", Some(reference("IdentityProvider"))));
            put(201, answer("Created", Some(reference("IdentityProvider"))));
            put(409, error("It is defined in the configuration file"));
            put(412, error("If-Match or If-None-Match does not hold"));
        }
        ("delete", Shape::Resource("IdentityProvider")) => {
            put(200, answer("Deleted: its tokens are no longer taken", None));
            put(404, error("It does not exist"));
            put(409, error("It is defined in the configuration file"));
            put(412, error("If-Match does not hold"));
        }
        // Webhooks live outside fleets and have no state to conflict with.
        ("put", Shape::Resource("Webhook")) => {
            put(200, answer("Replaced", Some(reference("Webhook"))));
            put(201, answer("Created", Some(reference("Webhook"))));
            put(412, error("If-Match or If-None-Match does not hold"));
        }
        ("delete", Shape::Resource("Webhook")) => {
            put(200, answer("Deleted, with its deliveries", None));
            put(404, error("It does not exist"));
            put(412, error("If-Match does not hold"));
        }
        ("put", Shape::Resource(schema)) => {
            put(200, answer("Replaced", Some(reference(schema))));
            put(201, answer("Created", Some(reference(schema))));
            put(404, error("The fleet does not exist"));
            put(
                409,
                error("It conflicts with the state of the fleet or run"),
            );
            put(412, error("If-Match or If-None-Match does not hold"));
        }
        ("patch", Shape::Resource(schema)) => {
            put(200, answer("Changed", Some(reference(schema))));
            put(404, error("It does not exist"));
            put(409, error("It conflicts with the state of the run"));
            put(412, error("If-Match does not hold"));
        }
        ("delete", Shape::Resource("Token")) => {
            put(200, answer("Revoked", None));
            put(404, error("It does not exist"));
        }
        ("delete", Shape::Resource(_)) => {
            put(200, answer("Deleted", None));
            put(404, error("It does not exist"));
            put(409, error("It cannot be deleted in its state"));
            put(412, error("If-Match does not hold"));
        }
        ("post", Shape::Action(schema)) => {
            put(
                200,
                answer("The run after the action", Some(reference(schema))),
            );
            put(201, answer("The run created", Some(reference(schema))));
            put(404, error("It does not exist"));
            put(409, error("Not allowed in the run's state"));
            put(412, error("If-Match does not hold"));
        }
        ("post", Shape::List(schema)) => {
            put(201, answer("Created", Some(reference(schema))));
        }
        ("post", Shape::Other("ImportResult")) => {
            put(200, answer("Registered", Some(reference("ImportResult"))));
            put(404, error("The fleet does not exist"));
            put(409, error("A member or cluster id is taken"));
        }
        ("post", Shape::Other("DiscoverResult")) => {
            put(
                200,
                answer(
                    "What was found, by member name",
                    Some(reference("DiscoverResult")),
                ),
            );
            put(404, error("The fleet does not exist"));
            put(
                409,
                error("The fleet's driver discovers nothing, or cannot now"),
            );
        }
        ("post", Shape::Other("Forecast")) => {
            put(200, answer("The forecast", Some(reference("Forecast"))));
            put(400, error("A parameter is out of range or unknown"));
            put(404, error("The run or fleet does not exist"));
            put(
                409,
                error("The run has ended, or the fleet's driver cannot list releases"),
            );
        }
        ("post", Shape::Other(schema)) => {
            put(
                200,
                answer("The run the profile made", Some(reference(schema))),
            );
            put(404, error("It does not exist"));
            put(409, error("The profile cannot make a run now"));
        }
        ("get", Shape::Other("Events")) => {
            put(
                200,
                json!({"description": "The run's events; a live stream with Accept: text/event-stream",
                    "content": {"application/json": {"schema": reference("Events")},
                        "text/event-stream": {"schema": {"type": "string"}}}}),
            );
            put(404, error("The run does not exist"));
        }
        ("get", Shape::Other("Releases")) => {
            put(
                200,
                answer("The fleet's release catalog", Some(reference("Releases"))),
            );
            put(400, error("A parameter is invalid"));
            put(404, error("The fleet or region does not exist"));
            put(
                409,
                error("The fleet's driver cannot list its releases now"),
            );
        }
        ("get", Shape::Other("Deliveries")) => {
            put(
                200,
                answer(
                    "The webhook's deliveries, oldest first",
                    Some(reference("Deliveries")),
                ),
            );
            put(400, error("A parameter is invalid"));
            put(404, error("The webhook does not exist"));
        }
        ("get", Shape::Other("Audit")) => {
            put(
                200,
                answer("The audit trail, oldest first", Some(reference("Audit"))),
            );
            put(400, error("A parameter is invalid"));
        }
        ("get", Shape::Other(schema)) => {
            put(200, answer("OK", Some(reference(schema))));
        }
        (_, Shape::Redirect) => {
            let text = json!({"text/plain": {"schema": {"type": "string"}}});
            put(
                303,
                json!({"description": "To the identity provider, or back to the dashboard"}),
            );
            put(
                400,
                json!({"description": "The request is not a sign-in this server started", "content": text}),
            );
            put(
                401,
                json!({"description": "The identity provider refused, or its ID token is not valid", "content": text}),
            );
            put(
                403,
                json!({"description": "Signed in, but mapped to no role", "content": text}),
            );
            put(
                500,
                json!({"description": "No random source", "content": text}),
            );
            put(
                502,
                json!({"description": "The identity provider cannot be reached", "content": text}),
            );
        }
        (_, Shape::SignOut) => {
            let text = json!({"text/plain": {"schema": {"type": "string"}}});
            put(
                200,
                answer(
                    "Signed out",
                    Some(json!({"type": "object", "properties": {
                "signedOut": {"type": "boolean"}, "endSessionUrl": {"type": "string", "nullable": true}}})),
                ),
            );
            put(401, json!({"description": "No session", "content": text}));
            put(
                403,
                json!({"description": "Not the session's CSRF token", "content": text}),
            );
        }
        (_, Shape::Text) => {
            put(
                200,
                json!({"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}},
                    "application/openmetrics-text": {"schema": {"type": "string"}}}}),
            );
        }
        _ => {
            put(
                200,
                json!({"description": "OK", "content": {"text/html": {"schema": {"type": "string"}}, "*/*": {"schema": {"type": "string"}}}}),
            );
            put(404, error("No such page"));
        }
    }
    if body {
        put(400, error("The body is invalid; the error names the field"));
        put(413, error("The body is too large"));
        put(415, error("The body is not JSON"));
    }
    if method != "get" {
        put(
            403,
            error("The role is too low, or the request came from another site"),
        );
    }
    if role != "none" {
        put(401, error("No token, or a token that is not valid"));
        put(403, error("The role is too low"));
    }
    // Any route, when the server is at its request limit or the store is down (`/readyz` says so
    // in plain text).
    put(
        503,
        json!({"description": "The server is busy, or the store cannot be reached or ended the write (nothing was written unless the message says it cannot tell); send it again after the Retry-After header",
            "content": {"application/json": {"schema": reference("Error")},
                "text/plain": {"schema": {"type": "string"}}}}),
    );
    put(408, error("The request did not arrive in time"));
    put(421, error("The server does not answer to this Host"));
    put(
        429,
        error("Too many requests at once; retry after the Retry-After header"),
    );
    out
}

/// A resource name (API.md, "Paths").
const NAME: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

fn parameters(method: &str, path: &str, shape: Shape) -> Vec<Value> {
    let mut params: Vec<Value> = path
        .split('/')
        .filter_map(|p| p.strip_prefix('{').and_then(|p| p.strip_suffix('}')))
        .map(|p| {
            // Names as API.md gives them; tokens' ids and the dashboard's assets are any text.
            let schema = match p {
                "asset" | "id" => json!({"type": "string", "minLength": 1}),
                "fleet" => json!({"type": "string", "pattern": NAME, "maxLength": 63}),
                _ => json!({"type": "string", "pattern": NAME, "maxLength": 50}),
            };
            json!({"name": p, "in": "path", "required": true, "schema": schema})
        })
        .collect();
    let query = |name: &str, schema: Value| json!({"name": name, "in": "query", "schema": schema});
    // Tokens are few and listed whole.
    if method == "get" && matches!(shape, Shape::List(_)) && shape != Shape::List("Token") {
        params.push(query(
            "$top",
            json!({"type": "integer", "minimum": 1, "maximum": 1000}),
        ));
        params.push(query("$skipToken", json!({"type": "string"})));
    }
    if method == "get" && shape == Shape::List("Gate") {
        params.push(query(
            "state",
            json!({"type": "string", "enum": ["Pending", "Completed", "Skipped", "Failed"]}),
        ));
        params.push(query("$filter", json!({"type": "string"})));
    }
    if shape == Shape::Other("Releases") {
        params.push(query("region", json!({"type": "string"})));
    }
    if shape == Shape::Other("Audit") {
        params.push(query(
            "fleet",
            json!({"type": "string", "pattern": NAME, "maxLength": 63}),
        ));
        params.push(query(
            "$top",
            json!({"type": "integer", "minimum": 1, "maximum": 1000}),
        ));
        params.push(query("after", json!({"type": "integer", "minimum": 0})));
        params.push(query(
            "since",
            json!({"type": "string", "format": "date-time"}),
        ));
    }
    if shape == Shape::Other("Deliveries") {
        params.push(query(
            "state",
            json!({"type": "string", "enum": ["Pending", "Delivered", "Abandoned"]}),
        ));
        params.push(query(
            "$top",
            json!({"type": "integer", "minimum": 1, "maximum": 1000}),
        ));
        params.push(query("after", json!({"type": "integer", "minimum": 0})));
    }
    // Writes to a resource with an eTag take `If-Match`; tokens, imports and profiles' generated
    // runs have none.
    let conditional = match shape {
        Shape::Resource(schema) => schema != "Token",
        Shape::Action(_) => true,
        _ => false,
    };
    if matches!(method, "put" | "patch" | "delete" | "post") && conditional {
        let header =
            |name: &str| json!({"name": name, "in": "header", "schema": {"type": "string"}});
        params.push(header("If-Match"));
        if method == "put" {
            params.push(header("If-None-Match"));
        }
    }
    params
}

/// The OpenAPI document of `routes` (method, path, summary, role).
pub fn document(routes: &[(&str, &str, &str, &str)]) -> Value {
    let mut paths = Map::new();
    for (method, path, summary, role) in routes {
        let shape = shape(path);
        let body = request_body(method, path, shape);
        let mut op = json!({
            "summary": summary,
            "operationId": operation_id(method, path),
            "parameters": parameters(method, path, shape),
            "responses": responses(method, role, shape, body.is_some()),
            "x-flotilla-role": role,
        });
        if let Some((schema, required)) = body {
            op["requestBody"] = json!({"required": required, "content": json_content(schema)});
        }
        if *role != "none" {
            op["security"] = json!([{"bearer": []}]);
        }
        paths.entry(path.to_string()).or_insert_with(|| json!({}))[*method] = op;
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Flotilla", "version": env!("CARGO_PKG_VERSION"), "description": "Staged upgrades of Kubernetes fleets; resource shapes follow the Fleet Manager REST API."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas(),
        },
    })
}

/// `get_v1_fleets_fleet_members`: unique per route, stable.
fn operation_id(method: &str, path: &str) -> String {
    let mut id = method.to_string();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        id.push('_');
        id.extend(
            part.chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .map(|c| c.to_ascii_lowercase()),
        );
    }
    id
}

/// A resource's envelope around `properties`.
fn envelope(properties: Value) -> Value {
    json!({
        "type": "object",
        // readOnly: required in answers, never sent (OpenAPI 3.0).
        "required": ["id", "name", "type", "eTag", "properties"],
        "properties": {
            "id": {"type": "string", "readOnly": true},
            "name": {"type": "string", "readOnly": true},
            "type": {"type": "string", "readOnly": true},
            "eTag": {"type": "string", "readOnly": true},
            "systemData": {"type": "object", "readOnly": true},
            "properties": properties,
        },
    })
}

fn object(properties: Value) -> Value {
    json!({"type": "object", "properties": properties})
}

fn schemas() -> Value {
    let text = json!({"type": "string"});
    let labels = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let tags = json!({"type": "object", "maxProperties": 50, "additionalProperties": {"type": "string", "maxLength": 256}});
    let state = json!({"type": "string", "readOnly": true});
    // Fleet Manager's tracked-resource fields beside the envelope.
    let mut fleet = envelope(object(json!({
        "provisioningState": state,
        "driver": {"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["sim", "exec", "aks"]}}},
        "hubProfile": {"type": "object"}})));
    fleet["properties"]["location"] = text.clone();
    fleet["properties"]["tags"] = tags.clone();
    fleet["properties"]["identity"] = json!({"type": "object"});
    // SEMANTICS §10: a check, a block of them on a stage or group, and a HealthCheck gate's.
    let seconds = json!({"type": "integer"});
    // A check names a provider and carries only data; the type may be left to the data.
    let check = json!({"type": "object", "required": ["name", "provider"], "properties": {
        "name": text, "provider": text,
        "type": {"type": "string", "enum": ["Prometheus", "Http", "Exec"]},
        "query": text, "condition": text,
        "onEmpty": {"type": "string", "enum": ["Fail", "Pass"]},
        "path": {"type": "string", "pattern": "^/"}, "expectStatus": {"type": "integer"},
        "bodyContains": text, "args": {"type": "array", "items": text},
        "requestTimeoutSeconds": seconds}});
    let block = json!({"type": "object", "required": ["checks"], "properties": {
        "checks": {"type": "array", "items": check.clone()},
        "soakSeconds": seconds, "intervalSeconds": seconds, "timeoutSeconds": seconds,
        "unavailableAfterSeconds": seconds}});
    let gate = json!({"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["Approval", "ScheduledStart", "HealthCheck"]},
        "displayName": text,
        "checks": {"type": "array", "items": check},
        "soakSeconds": seconds, "intervalSeconds": seconds, "timeoutSeconds": seconds,
        "unavailableAfterSeconds": seconds}});
    let stage = json!({"type": "object", "required": ["name"], "properties": {
        "name": text,
        "groups": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": text, "maxConcurrency": text, "maxAllowedFailures": text,
            "beforeGates": {"type": "array", "items": gate}, "afterGates": {"type": "array", "items": gate},
            "memberHealthChecks": block, "readinessChecks": block}}},
        "memberSelector": {"type": "object"},
        "maxConcurrency": text,
        "maxAllowedFailures": text,
        "afterStageWaitInSeconds": {"type": "integer", "minimum": 0,
            "maximum": flotilla_engine::strategy::MAX_STAGE_WAIT_SECONDS},
        "beforeGates": {"type": "array", "items": gate},
        "afterGates": {"type": "array", "items": gate},
        "memberHealthChecks": block, "readinessChecks": block}});
    let strategy = json!({"type": "object", "required": ["stages"], "properties": {
        "stages": {"type": "array", "items": stage}}});
    let update = json!({"type": "object", "required": ["upgrade"], "properties": {
        "upgrade": {"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["Full", "ControlPlaneOnly", "NodeImageOnly"]},
            "kubernetesVersion": text}},
        "nodeImageSelection": {"type": "object", "properties": {
            "type": {"type": "string", "enum": ["Latest", "Consistent", "Custom"]},
            "customNodeImageVersions": {"type": "array", "items": {"type": "object", "properties": {"version": text}}}}}}});
    // Apart: one `json!` of every schema is past the macro's recursion limit.
    let audit = json!({"type": "object", "required": ["value"], "properties": {
            "value": {"type": "array", "items": {"type": "object",
                "required": ["id", "time", "subject", "role", "method", "path", "status"],
                "properties": {"id": {"type": "integer"}, "time": text, "subject": text, "role": text,
                    "method": text, "path": text, "fleet": text, "status": {"type": "integer"}, "body": {}}}},
            "nextLink": text}});
    // A forecast (SEMANTICS §11), in parts (one json! of it all is too deep for the macro).
    let time_or_null = json!({"type": "string", "nullable": true});
    let forecast_hold = json!({"type": "object", "required": ["kind", "until"], "description": "one thing a stage's or group's start waits for (only what actually holds it) and when it is predicted to end (null: not within a year; never before computedAt)", "properties": {
        "kind": {"type": "string", "enum": ["Approval", "ScheduledStart", "HealthCheck", "Wait", "Stage", "Window", "Version", "Lock", "Freeze", "Budget", "Readiness"]},
        "gateId": {"type": "string"},
        "displayName": {"type": "string"},
        "state": {"type": "string", "enum": ["Pending", "NotStarted"]},
        "stage": {"type": "string"},
        "members": {"type": "integer", "minimum": 1},
        "until": time_or_null}});
    let holds = json!({"type": "array", "items": {"$ref": "#/components/schemas/ForecastHold"}});
    let forecast_member = json!({"type": "object", "required": ["name", "state", "startTime", "completedTime", "waitsFor"], "properties": {
        "name": {"type": "string"},
        "state": {"type": "string"},
        "startTime": time_or_null,
        "completedTime": time_or_null,
        "waitsFor": {"type": "array", "items": {"type": "string", "enum": ["Window", "Version", "Lock", "Slot", "Gate", "Wait", "Readiness", "Freeze", "Budget"]}},
        "overdue": {"type": "boolean", "description": "in flight longer than its expected duration: predicted to finish now, not in the past"}}});
    let forecast_group = json!({"type": "object", "required": ["name", "startTime", "completedTime", "waitsFor", "members"], "properties": {
        "name": {"type": "string"},
        "startTime": time_or_null,
        "completedTime": time_or_null,
        "waitsFor": holds,
        "members": {"type": "array", "items": forecast_member}}});
    let forecast_stage = json!({"type": "object", "required": ["name", "startTime", "completedTime", "waitsFor", "groups"], "properties": {
        "name": {"type": "string"},
        "startTime": time_or_null,
        "completedTime": time_or_null,
        "waitsFor": holds,
        "groups": {"type": "array", "items": forecast_group}}});
    let pending_gate = json!({"type": "object", "required": ["gateId", "type", "assumed", "until"], "properties": {
        "gateId": {"type": "string"},
        "type": {"type": "string", "enum": ["Approval", "ScheduledStart", "HealthCheck"]},
        "displayName": {"type": "string"},
        "assumed": {"type": "string", "enum": ["ApprovedNow", "ApprovedAfterDelay", "OpensAtItsTime", "ChecksPass"]},
        "until": time_or_null}});
    let assumptions = json!({"type": "object", "required": ["approvals", "pendingGates", "checks", "failures", "durations", "approvalDelaySeconds", "defaultDurationSeconds"], "properties": {
        "approvals": {"type": "string", "enum": ["IfApprovedNow", "IfApprovedAfterDelay"], "description": "IfApprovedNow: every Approval gate pending now is taken as approved now, and each one reached later the moment it is reached; IfApprovedAfterDelay: approvalDelaySeconds after"},
        "pendingGates": {"type": "array", "items": pending_gate},
        "checks": {"type": "string", "enum": ["Pass"]},
        "failures": {"type": "string", "enum": ["None"]},
        "durations": {"type": "object", "required": ["history", "fleetMedian", "driver", "default"], "properties": {
            "history": {"type": "integer"}, "fleetMedian": {"type": "integer"},
            "driver": {"type": "integer"}, "default": {"type": "integer"}}},
        "approvalDelaySeconds": {"type": "integer"},
        "defaultDurationSeconds": {"type": "integer"}}});
    let forecast = json!({"type": "object", "required": ["computedAt", "stages", "criticalPath", "assumptions"], "properties": {
        "completedTime": time_or_null,
        "computedAt": {"type": "string"},
        "stages": {"type": "array", "items": forecast_stage},
        "criticalPath": {"type": "array", "items": {"type": "object", "properties": {
            "kind": {"type": "string"}, "name": {"type": "string"}, "from": {"type": "string"}, "to": {"type": "string"}}}},
        "assumptions": assumptions}});
    let mut schemas = json!({
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"], "properties": {
                "code": text, "message": text, "target": text}}}},
        "Fleet": fleet,
        "FleetPatch": {"type": "object", "additionalProperties": false, "properties": {
            "tags": tags, "identity": {"type": "object"}}},
        "Member": envelope(object(json!({
            "provisioningState": state,
            "clusterResourceId": text,
            "group": text,
            "labels": labels,
            "status": {"type": "object", "readOnly": true}}))),
        "MemberPatch": envelope(object(json!({"group": text, "labels": labels}))),
        "MemberImport": {"type": "object", "required": ["value"], "properties": {
            "value": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
                "name": text,
                "properties": {"type": "object", "properties": {"clusterResourceId": text, "group": text, "labels": labels}}}}},
            "mode": text}},
        "ImportResult": {"type": "object", "required": ["created", "updated"], "properties": {
            "created": {"type": "integer"}, "updated": {"type": "integer"}}},
        "GeneratedRun": {"type": "object", "required": ["id"], "properties": {"id": text}},
        "DiscoverResult": {"type": "object", "required": ["added", "updated", "vanished"], "properties": {
            "added": {"type": "array", "items": text}, "updated": {"type": "array", "items": text},
            "vanished": {"type": "array", "items": text}}},
        "ForecastRequest": {"type": "object", "additionalProperties": false, "properties": {
            "approvalDelaySeconds": {"type": "integer", "minimum": 0, "maximum": 31_622_400},
            "defaultDurationSeconds": {"type": "integer", "minimum": 1, "maximum": 31_622_400}}},
        "WhatIfForecastRequest": {"type": "object", "required": ["run"], "additionalProperties": false, "properties": {
            "run": reference("UpdateRun"),
            "approvalDelaySeconds": {"type": "integer", "minimum": 0, "maximum": 31_622_400},
            "defaultDurationSeconds": {"type": "integer", "minimum": 1, "maximum": 31_622_400}}},
        "Forecast": forecast,
        "ForecastHold": forecast_hold,
        "UpdateStrategy": envelope(object(json!({
            "provisioningState": state,
            "strategy": strategy}))),
        "UpdateRun": envelope(object(json!({
            "provisioningState": state,
            "updateStrategyId": text,
            "strategy": strategy,
            "managedClusterUpdate": update,
            "chainMinorVersions": {"type": "boolean", "description": "SEMANTICS §13: a target more than one minor ahead is reached one minor at a time; each member's status lists its hops"},
            "autoUpgradeProfileId": {"type": "string", "readOnly": true},
            "rollbackOf": {"type": "string", "readOnly": true, "description": "SEMANTICS §15: a rollback run names the run it rolls back (made only by POST …/rollback; 400 if written)"},
            "status": {"type": "object", "readOnly": true, "description": "The run's progress; `rollbackOf` and `rolledBackBy` name a rollback run's origin and a run's rollback run (SEMANTICS §15); `promotedFrom` a promoted run's upstream run and `endedOn` what a Completed run left its members on (§14)"}}))),
        "SkipRequest": {"type": "object", "required": ["targets"], "properties": {
            "targets": {"type": "array", "items": {"type": "object", "required": ["type", "name"], "properties": {
                "type": {"type": "string", "enum": ["Member", "Group", "Stage", "AfterStageWait"]},
                "name": text}}}}},
        "Gate": envelope(object(json!({
            "displayName": text,
            "gateType": text,
            "state": text,
            "target": {"type": "object"},
            "approvedBy": text}))),
        "GatePatch": envelope(json!({"type": "object", "required": ["state"], "properties": {
            "state": {"type": "string", "enum": ["Completed"]}}})),
        "AutoUpgradeProfile": envelope(object(json!({
            "provisioningState": state,
            "channel": {"type": "string", "enum": ["Stable", "Rapid", "NodeImage", "TargetKubernetesVersion", "SecurityPatch"]},
            "updateStrategyId": text,
            "disabled": {"type": "boolean"},
            "targetKubernetesVersion": text,
            "longTermSupport": {"type": "boolean"},
            "chainMinorVersions": {"type": "boolean"},
            "nodeImageSelection": {"type": "object"},
            "upstream": {"type": "object", "description": "SEMANTICS §14: trigger only on what this upstream profile validated, once soaked", "properties": {
                "profileId": text,
                "soakSeconds": {"type": "integer", "minimum": 0, "maximum": 31_536_000}}},
            "autoUpgradeProfileStatus": {"type": "object", "readOnly": true, "description": "The last trigger; for a downstream profile, `upstream: {validatedTarget, validatedAt, validatedBy, soakEndsAt}`"}}))),
        "Token": {"type": "object", "required": ["id", "role", "subject"], "properties": {
            "id": text, "role": text, "subject": text,
            "token": {"type": "string", "description": "The secret, shown once when created"}}},
        "TokenRequest": {"type": "object", "required": ["role", "subject"], "properties": {
            "role": {"type": "string", "enum": ["reader", "operator", "approver", "admin"]},
            "subject": text}},
        "Me": {"type": "object", "required": ["subject", "role"], "properties": {"subject": text, "role": text,
            "grants": {"type": "array", "items": {"type": "object", "properties": {"fleets": text, "role": text}}},
            "csrfToken": {"type": "string", "description": "A dashboard session's: its writes carry it in X-CSRF-Token"},
            "arm": {"type": "object", "properties": {"subscription": text, "resourceGroup": text}}}},
        "Leases": {"type": "object", "required": ["replica", "value"], "properties": {
            "replica": text,
            "value": {"type": "array", "items": {"type": "object", "properties": {
                "fleet": text, "owner": text, "epoch": {"type": "integer"},
                "expiresInMs": {"type": "integer"}, "expired": {"type": "boolean"}}}}}},
        "Releases": {"type": "object", "required": ["regions"], "properties": {"regions": {"type": "object"}}},
        "Events": {"type": "object", "required": ["value"], "properties": {"value": {"type": "array", "items": {"type": "object"}}}},
        "OpenApi": {"type": "object", "required": ["openapi", "paths"], "properties": {"openapi": text, "paths": {"type": "object"}}},
    });
    schemas["Audit"] = audit;
    schemas["Webhook"] = webhook_schema();
    schemas["CheckProvider"] = check_provider_schema();
    schemas["IdentityProvider"] = identity_provider_schema();
    schemas["AuthSession"] = json!({"type": "object", "required": ["signedIn"], "properties": {"signedIn": {"type": "boolean"}}});
    schemas["AuthProviders"] = json!({"type": "object", "required": ["value"], "properties": {
        "value": {"type": "array", "items": {"type": "object", "required": ["name", "issuer"], "properties": {
            "name": {"type": "string"}, "issuer": {"type": "string"},
            "clientId": {"type": "string", "nullable": true}, "cliClientId": {"type": "string", "nullable": true},
            "scopes": {"type": "array", "items": {"type": "string"}}, "dashboard": {"type": "boolean"}}}}}});
    schemas["Freeze"] = freeze_schema();
    schemas["DisruptionBudget"] = budget_schema();
    schemas["Deliveries"] = deliveries_schema();
    schemas
}

/// A webhook: its secret is sent, never shown (`hasSecret` says there is one).
fn webhook_schema() -> Value {
    let text = json!({"type": "string"});
    let names = json!({"type": "array", "minItems": 1, "maxItems": 100, "items": text});
    envelope(
        json!({"type": "object", "required": ["url"], "properties": {
        "url": {"type": "string", "format": "uri", "maxLength": 2048},
        "secret": {"type": "string", "minLength": 1, "maxLength": 1024, "writeOnly": true},
        "hasSecret": {"type": "boolean", "readOnly": true},
        "fleets": names.clone(),
        "events": names,
        "format": {"type": "string", "enum": ["CloudEvents", "Slack", "Teams"]}}}),
    )
}

/// A freeze (SEMANTICS §12): one-off (start, end) or recurring, its status worked out on read.
fn freeze_schema() -> Value {
    let text = json!({"type": "string"});
    let time = json!({"type": "string", "format": "date-time"});
    envelope(json!({"type": "object", "properties": {
        "start": time, "end": time,
        "recurrence": {"type": "object", "required": ["schedule", "durationHours"], "properties": {
            "schedule": {"type": "object"}, "startTime": text, "utcOffset": text, "startDate": text,
            "durationHours": {"type": "integer", "minimum": 1, "maximum": 168}}},
        "selector": {"type": "object", "properties": {"byLabel": text}},
        "scope": {"type": "string", "enum": ["AllUpgrades", "MinorUpgrades", "MinorAndNodeUpgrades"]},
        "reason": {"type": "string", "maxLength": 200},
        "status": {"type": "object", "readOnly": true, "properties": {
            "active": {"type": "boolean"}, "nextStart": time, "nextEnd": time,
            "members": {"type": "integer"}}}}}))
}

/// A disruption budget (SEMANTICS §12).
fn budget_schema() -> Value {
    let text = json!({"type": "string"});
    let count = json!({"type": "integer", "minimum": 0});
    envelope(
        json!({"type": "object", "required": ["maxUnavailable"], "properties": {
        "maxUnavailable": {"type": "string", "pattern": "^(?:[1-9][0-9]*|(?:[1-9][0-9]?|100)%)$"},
        "selector": {"type": "object", "properties": {"byLabel": text}},
        "perValueOf": {"type": "string", "pattern": "^(?:region|group|label:.+)$"},
        "status": {"type": "object", "readOnly": true, "properties": {
            "partitions": {"type": "array", "items": {"type": "object", "properties": {
                "value": text, "members": count, "maxUnavailable": count, "disrupted": count}}}}}}}),
    )
}

/// A check provider (SEMANTICS §10): where checks may go, declared by an admin.
fn check_provider_schema() -> Value {
    let text = json!({"type": "string"});
    // No resource `type` beside `name`: `properties.type` is the provider's, and the CLI lifts
    // `properties` beside `name` as `az` does.
    let mut schema = envelope(
        json!({"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["Prometheus", "Http", "Exec"]},
        "endpoint": {"type": "string", "format": "uri"},
        "baseUrl": {"type": "string", "format": "uri"},
        "command": {"type": "array", "minItems": 1, "items": text},
        "allowOptions": {"type": "boolean"},
        "headers": {"type": "object", "additionalProperties": text,
            "description": "Literal values are shown as <redacted>; {env:FLOTILLA_CHECK_*} references as written"},
        "caFile": text,
        "fleets": {"type": "array", "minItems": 1, "maxItems": 100, "items": text}}}),
    );
    schema["required"] = json!(["id", "name", "eTag", "properties"]);
    if let Some(fields) = schema["properties"].as_object_mut() {
        fields.remove("type");
    }
    schema
}

/// An identity provider (docs/oidc.md): whose JWTs are taken, and the roles they map to.
fn identity_provider_schema() -> Value {
    let text = json!({"type": "string", "minLength": 1});
    let texts = json!({"type": "array", "items": text});
    let role = json!({"type": "string", "enum": ["reader", "operator", "approver", "admin"]});
    let mut schema = envelope(json!({"type": "object", "required": ["issuer", "audience"],
        "additionalProperties": false, "properties": {
        "issuer": {"type": "string", "format": "uri", "maxLength": 2048},
        "audience": text, "clientId": text, "cliClientId": text,
        "clientSecret": {"type": "object", "additionalProperties": false,
            "description": "Where the secret is read: {\"env\": NAME} or {\"file\": PATH}",
            "properties": {"env": text, "file": text}},
        "userClaim": text, "groupsClaim": text, "scopes": texts,
        "roles": {"type": "array", "items": {"type": "object", "required": ["role"],
            "additionalProperties": false, "properties": {
            "groups": texts, "subjects": texts, "role": role,
            "fleets": {"type": "array", "minItems": 1, "items": text}}}},
        "source": {"type": "string", "enum": ["file", "api"], "readOnly": true}}}));
    // A provider of the configuration file has no eTag (it is not stored), nor a `type`.
    schema["required"] = json!(["id", "name", "properties"]);
    if let Some(fields) = schema["properties"].as_object_mut() {
        fields.remove("type");
    }
    schema
}

/// A page of a webhook's deliveries.
fn deliveries_schema() -> Value {
    let text = json!({"type": "string"});
    let integer = json!({"type": "integer"});
    json!({"type": "object", "required": ["value"], "properties": {
        "value": {"type": "array", "items": {"type": "object",
            "required": ["id", "time", "eventId", "eventType", "fleet", "run", "state", "attempts"],
            "properties": {"id": integer, "time": text, "eventId": text, "eventType": text,
                "fleet": text, "run": text,
                "state": {"type": "string", "enum": ["Pending", "Delivered", "Abandoned"]},
                "attempts": integer, "statusCode": integer, "lastError": text,
                "lastAttemptTime": text, "deliveredTime": text, "nextAttemptTime": text}}},
        "nextLink": text}})
}
