//! The CLI's side of the API: where the server is, which token to send, one clear line for every
//! error, and the output formats (aligned tables with coloured states, JSON, YAML).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::{Value, json};

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    /// JSON, as `az`'s `jsonc` (colour is not added).
    Jsonc,
    Yaml,
    /// YAML, as `az`'s `yamlc` (colour is not added).
    Yamlc,
    /// As `az`'s `tsv`: a line per item, its scalar values separated by tabs, no header.
    Tsv,
    /// Nothing: the exit code says how the command went.
    None,
}

/// Settings written by `flotilla login`.
pub fn config_path() -> Option<PathBuf> {
    std::env::var_os("FLOTILLA_CONFIG")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CONFIG_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
                .map(|d| d.join("flotilla").join("config.json"))
        })
}

pub fn read_config() -> Value {
    config_path()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(json!({}))
}

pub fn write_config(server: &str, token: &str, ca_file: Option<&Path>) -> anyhow::Result<PathBuf> {
    let mut settings = json!({"server": server, "token": token});
    if let Some(ca) = ca_file {
        let absolute = ca.canonicalize().unwrap_or_else(|_| ca.to_path_buf());
        settings["caFile"] = json!(absolute.display().to_string());
    }
    write_settings(&settings)
}

/// Writes the login file whole. It holds secrets (a token, an identity provider's refresh
/// token): the file is private (0600) before anything is written to it, and replaced whole
/// (written beside it, then renamed), so no reader ever sees it open or half-written.
pub fn write_settings(settings: &Value) -> anyhow::Result<PathBuf> {
    let path = config_path()
        .context("cannot find a configuration directory: set FLOTILLA_CONFIG or HOME")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(settings)?;
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let _ = std::fs::remove_file(&temporary);
    let mut file = options
        .open(&temporary)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, &path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// A request the server answered with an error: its status decides the exit code (a missing
/// resource exits 3, as `az` does).
#[derive(Debug)]
pub struct HttpFailure {
    pub status: u16,
    pub line: String,
}

impl std::fmt::Display for HttpFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line)
    }
}

impl std::error::Error for HttpFailure {}

/// A person's sign-in through an identity provider (`flotilla login --oidc`), as the login
/// file keeps it under `oidc`: the access token sent, renewed with the refresh token shortly
/// before it expires.
#[derive(Clone, Debug)]
pub struct OidcLogin {
    pub issuer: String,
    pub client_id: String,
    pub token_endpoint: String,
    pub access_token: String,
    pub refresh_token: Option<String>,
    /// Seconds since the epoch.
    pub expires_at: i64,
}

/// Renewed this many seconds before the access token expires.
const REFRESH_BEFORE: i64 = 5;

fn epoch_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl OidcLogin {
    pub fn from_value(value: &Value) -> Option<OidcLogin> {
        let text = |k: &str| value[k].as_str().map(String::from);
        Some(OidcLogin {
            issuer: text("issuer")?,
            client_id: text("clientId")?,
            token_endpoint: text("tokenEndpoint")?,
            access_token: text("accessToken")?,
            refresh_token: text("refreshToken"),
            expires_at: value["expiresAt"].as_i64()?,
        })
    }

    pub fn to_value(&self) -> Value {
        json!({"issuer": self.issuer, "clientId": self.client_id, "tokenEndpoint": self.token_endpoint,
            "accessToken": self.access_token, "refreshToken": self.refresh_token, "expiresAt": self.expires_at})
    }

    /// Takes a token endpoint's answer (`access_token`, `expires_in`, maybe a new
    /// `refresh_token`).
    pub fn take(&mut self, answer: &Value) -> anyhow::Result<()> {
        self.access_token = answer["access_token"]
            .as_str()
            .context("the identity provider answered no access_token")?
            .to_string();
        if let Some(refresh) = answer["refresh_token"].as_str() {
            self.refresh_token = Some(refresh.to_string());
        }
        self.expires_at = epoch_now() + answer["expires_in"].as_i64().unwrap_or(300);
        Ok(())
    }
}

/// POSTs a form to an identity provider's endpoint; its JSON answer, or its OAuth error.
pub async fn post_form(
    http: &reqwest::Client,
    url: &str,
    pairs: &[(&str, &str)],
) -> anyhow::Result<(reqwest::StatusCode, Value)> {
    let body = flotilla_server::oidc::form_body(pairs).map_err(anyhow::Error::msg)?;
    let response = http
        .post(url)
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .header(reqwest::header::ACCEPT, "application/json")
        .body(body)
        .send()
        .await
        .with_context(|| format!("cannot reach the identity provider at {url}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{url}: {status}, not JSON: {}",
            text.chars().take(200).collect::<String>()
        )
    })?;
    Ok((status, value))
}

pub struct Client {
    pub http: reqwest::Client,
    pub server: String,
    token: Option<String>,
    /// Without a token given: the login file's identity provider sign-in.
    oidc: Option<tokio::sync::Mutex<OidcLogin>>,
    /// `-g` and `--subscription`: Fleet Manager's resources are then asked for at their ARM
    /// paths, where a fleet of another resource group or subscription is not found (as in `az`).
    arm: Option<ArmScope>,
}

/// Where `-g/--resource-group` and `--subscription` say the fleets are.
pub struct ArmScope {
    pub resource_group: String,
    /// `None`: the server's own (`flotilla serve --arm-subscription`), as `az` takes the
    /// default subscription; asked of `/v1/me` once.
    pub subscription: Option<String>,
    asked: tokio::sync::OnceCell<String>,
}

impl ArmScope {
    pub fn new(resource_group: String, subscription: Option<String>) -> ArmScope {
        ArmScope {
            resource_group,
            subscription,
            asked: tokio::sync::OnceCell::new(),
        }
    }
}

/// The API version the CLI asks the ARM paths for: Fleet Manager's stable 2025-03-01.
const ARM_API_VERSION: &str = "2025-03-01";

/// The ARM path of a `/v1` path, where Fleet Manager has one (fleets, their members, update
/// strategies, update runs and their start/stop/skip, gates, auto-upgrade profiles and
/// generateUpdateRun); `None` for Flotilla's own (events, forecasts, releases, imports).
pub fn arm_path(path: &str, subscription: &str, resource_group: &str) -> Option<String> {
    use flotilla_server::arm::COLLECTIONS;
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    let rest = route.strip_prefix("/v1/fleets")?;
    let parts: Vec<&str> = rest.split('/').skip(1).collect();
    let fits = match parts.as_slice() {
        [] | [_] => true,
        [_, collection, more @ ..] => COLLECTIONS.iter().any(|(c, actions)| {
            c == collection
                && match more {
                    [] | [_] => true,
                    [_, action] => actions.contains(action),
                    _ => false,
                }
        }),
    };
    if !fits || parts.iter().any(|p| p.is_empty() || p.contains(':')) {
        return None;
    }
    let mut arm = format!(
        "/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.ContainerService/fleets{rest}?api-version={ARM_API_VERSION}"
    );
    if !query.is_empty() {
        arm.push('&');
        arm.push_str(query);
    }
    Some(arm)
}

impl Client {
    /// `--server` / `FLOTILLA_SERVER`, then the login file, then the default; likewise the token.
    /// `ca_file` adds a certificate authority (PEM) to trust for an `https://` server.
    pub fn new(
        server: Option<String>,
        token: Option<String>,
        ca_file: Option<&Path>,
    ) -> anyhow::Result<Client> {
        let config = read_config();
        let server = server
            .or_else(|| config["server"].as_str().map(String::from))
            .unwrap_or_else(|| DEFAULT_SERVER.to_string())
            .trim_end_matches('/')
            .to_string();
        let oidc = match (&token, OidcLogin::from_value(&config["oidc"])) {
            (None, Some(login)) => Some(tokio::sync::Mutex::new(login)),
            _ => None,
        };
        let token = token.or_else(|| config["token"].as_str().map(String::from));
        let saved = config["caFile"].as_str().map(PathBuf::from);
        let mut http = reqwest::Client::builder();
        if let Some(path) = ca_file.or(saved.as_deref()) {
            let pem = std::fs::read(path)
                .with_context(|| format!("--ca-file {}: cannot read it", path.display()))?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("--ca-file {}: not PEM certificates", path.display()))?;
            if certificates.is_empty() {
                anyhow::bail!("--ca-file {}: no certificate in it", path.display());
            }
            for certificate in certificates {
                http = http.add_root_certificate(certificate);
            }
        }
        // A redirect is not followed: the token (or the identity provider's grant) would be sent
        // on to wherever the answer points, which may not be the server the user named.
        let http = http
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("cannot set up the HTTP client (TLS)")?;
        Ok(Client {
            http,
            server,
            token,
            oidc,
            arm: None,
        })
    }

    /// Asks for Fleet Manager's resources at their ARM paths, in `scope`.
    pub fn within(mut self, scope: Option<ArmScope>) -> Client {
        self.arm = scope;
        self
    }

    /// The path to ask: the ARM one under `-g`, where there is one; a link the server gave
    /// (an absolute `nextLink`) as its path.
    async fn resolve(&self, path: &str) -> anyhow::Result<String> {
        let path = match path.strip_prefix(&self.server) {
            Some(rest) if path.starts_with("http") => rest,
            _ => path,
        };
        let Some(scope) = &self.arm else {
            return Ok(path.to_string());
        };
        if path.starts_with("/subscriptions/") {
            return Ok(path.to_string());
        }
        let subscription = match &scope.subscription {
            Some(s) => s.clone(),
            None => scope
                .asked
                .get_or_try_init(|| async {
                    let me = Box::pin(self.plain_get("/v1/me")).await?;
                    me["arm"]["subscription"]
                        .as_str()
                        .map(String::from)
                        .ok_or_else(|| {
                            anyhow::anyhow!(
                                "-g: the server names no default subscription; give --subscription"
                            )
                        })
                })
                .await?
                .clone(),
        };
        Ok(
            arm_path(path, &subscription, &scope.resource_group)
                .unwrap_or_else(|| path.to_string()),
        )
    }

    /// A GET of a `/v1` path as it is.
    async fn plain_get(&self, path: &str) -> anyhow::Result<Value> {
        self.exchange(reqwest::Method::GET, path, None).await
    }

    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> anyhow::Result<reqwest::RequestBuilder> {
        let mut r = self.http.request(method, format!("{}{path}", self.server));
        if let Some(t) = self.bearer().await? {
            r = r.bearer_auth(t);
        }
        Ok(r)
    }

    /// The token to send: the one given, else the identity provider's access token, renewed
    /// first with the refresh token when it is about to expire (and the login file updated).
    async fn bearer(&self) -> anyhow::Result<Option<String>> {
        let Some(oidc) = &self.oidc else {
            return Ok(self.token.clone());
        };
        let mut login = oidc.lock().await;
        if epoch_now() < login.expires_at - REFRESH_BEFORE {
            return Ok(Some(login.access_token.clone()));
        }
        let Some(refresh) = login.refresh_token.clone() else {
            bail!(
                "the identity provider's access token has expired and there is no refresh token; run `flotilla login --oidc` again"
            );
        };
        let (status, answer) = post_form(
            &self.http,
            &login.token_endpoint,
            &[
                ("grant_type", "refresh_token"),
                ("refresh_token", &refresh),
                ("client_id", &login.client_id),
            ],
        )
        .await?;
        if !status.is_success() {
            bail!(
                "the identity provider refused to renew the sign-in ({} {}); run `flotilla login --oidc` again",
                answer["error"].as_str().unwrap_or(status.as_str()),
                answer["error_description"].as_str().unwrap_or("")
            );
        }
        login.take(&answer)?;
        let mut settings = read_config();
        settings["oidc"] = login.to_value();
        write_settings(&settings)?;
        Ok(Some(login.access_token.clone()))
    }

    /// Sends a request; a non-2xx answer becomes one line with the field path.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let path = self.resolve(path).await?;
        self.exchange(method, &path, body).await
    }

    async fn exchange(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut request = self.request(method.clone(), path).await?;
        if let Some(b) = body {
            request = request.json(b);
        }
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let status = response.status();
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = response.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        if status.is_redirection() {
            return Err(HttpFailure {
                status: status.as_u16(),
                line: format!(
                    "{} answered a redirect to {:?} ({}); it is not followed, so as not to send the token elsewhere: give the address it names with --server if it is the server",
                    self.server,
                    location.unwrap_or_default(),
                    status.as_u16()
                ),
            }
            .into());
        }
        if !status.is_success() {
            let error = &value["error"];
            let message = error["message"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| text.trim().to_string());
            let target = error["target"]
                .as_str()
                .filter(|t| !t.is_empty() && !message.contains(*t));
            return Err(HttpFailure {
                status: status.as_u16(),
                line: format!(
                    "{} ({}{})",
                    message,
                    status.as_u16(),
                    target.map(|t| format!(", at {t}")).unwrap_or_default()
                ),
            }
            .into());
        }
        Ok(value)
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(reqwest::Method::GET, path, None).await
    }

    /// Every item of a paged list.
    pub async fn list_all(&self, path: &str) -> anyhow::Result<Vec<Value>> {
        let mut items = Vec::new();
        let mut next = Some(path.to_string());
        while let Some(p) = next {
            let page = self.get(&p).await?;
            items.extend(page["value"].as_array().cloned().unwrap_or_default());
            next = page["nextLink"].as_str().map(String::from);
        }
        Ok(items)
    }

    /// A streaming GET (server-sent events).
    /// A live event stream from the event after `after` (`Last-Event-ID`; 0: from the start).
    pub async fn stream(&self, path: &str, after: usize) -> anyhow::Result<reqwest::Response> {
        let response = self
            .request(reqwest::Method::GET, path)
            .await?
            .header("Accept", "text/event-stream")
            .header("Last-Event-ID", after.to_string())
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if !response.status().is_success() {
            let status = response.status();
            bail!(
                "{} ({})",
                response.text().await.unwrap_or_default(),
                status.as_u16()
            );
        }
        Ok(response)
    }

    fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "cannot reach the Flotilla server at {} ({}); start one with `flotilla serve` or point --server / FLOTILLA_SERVER at it",
            self.server,
            root_cause(&e)
        )
    }
}

fn root_cause(e: &dyn std::error::Error) -> String {
    let mut current = e;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

pub fn colour_enabled() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// A state word, coloured on a terminal.
pub fn state(text: &str, colour: bool) -> String {
    if !colour {
        return text.to_string();
    }
    let code = match text {
        "Completed" | "Succeeded" => "32",
        "Running" => "36",
        "Pending" | "Stopping" | "Stopped" => "33",
        "Failed" => "31",
        "Skipped" => "90",
        _ => "0",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

fn visible_len(s: &str) -> usize {
    let mut n = 0;
    let mut escape = false;
    for c in s.chars() {
        match (escape, c) {
            (false, '\x1b') => escape = true,
            (true, 'm') => escape = false,
            (true, _) => {}
            (false, _) => n += 1,
        }
    }
    n
}

/// An aligned table.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(visible_len(cell));
            }
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let mut parts = Vec::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(visible_len(cell));
            parts.push(if i + 1 == cells.len() {
                cell.clone()
            } else {
                format!("{cell}{}", " ".repeat(pad))
            });
        }
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect(), &mut out);
    for row in rows {
        line(row.clone(), &mut out);
    }
    out
}

/// The `--query` of this invocation (checked to compile when it is set).
static QUERY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Takes `--query`; a query that does not parse is refused before anything is sent. (One that
/// parses and fails on the answer, an unknown function say, fails after it, as with `az`.)
pub fn set_query(text: &str) -> anyhow::Result<()> {
    jmespath::compile(text).map_err(|e| query_error(text, &e))?;
    let _ = QUERY.set(text.to_string());
    Ok(())
}

/// One line: the parser's message without the picture of where it stopped.
fn query_error(text: &str, e: &jmespath::JmespathError) -> anyhow::Error {
    let message = e.to_string();
    let first = message.lines().next().unwrap_or_default().to_string();
    anyhow::anyhow!("--query {text:?}: {first}")
}

/// Whether the JMESPath `condition` holds over `value` (its result is truthy, as `az … wait
/// --custom` reads it).
pub fn query_holds(condition: &str, value: &Value) -> anyhow::Result<bool> {
    let failed = |e: jmespath::JmespathError| {
        let message = e.to_string();
        anyhow::anyhow!(
            "--custom {condition:?}: {}",
            message.lines().next().unwrap_or_default()
        )
    };
    let found = jmespath::compile(condition)
        .map_err(failed)?
        .search(value.clone())
        .map_err(failed)?;
    Ok(found.is_truthy())
}

/// The answer after `--query`, if one was given.
fn queried(value: &Value) -> anyhow::Result<Option<Value>> {
    let Some(text) = QUERY.get() else {
        return Ok(None);
    };
    let failed = |e: jmespath::JmespathError| query_error(text, &e);
    let found = jmespath::compile(text)
        .map_err(failed)?
        .search(value.clone())
        .map_err(failed)?;
    Ok(Some(serde_json::to_value(&*found)?))
}

/// A table of any value, for a `--query` result: a row per item, a column per scalar key.
fn any_table(value: &Value) -> String {
    let items = match value {
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    let mut headers: Vec<String> = Vec::new();
    for item in &items {
        if let Value::Object(m) = item {
            for key in m.keys() {
                if !headers.contains(key) {
                    headers.push(key.clone());
                }
            }
        }
    }
    if headers.is_empty() {
        return tsv(&Value::Array(items));
    }
    let cell = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| headers.iter().map(|h| cell(&item[h.as_str()])).collect())
        .collect();
    let names: Vec<&str> = headers.iter().map(String::as_str).collect();
    table(&names, &rows)
}

/// Prints a value as the user asked: JSON, YAML, or (for tables) the given text; with
/// `--query`, what the query selects from it.
pub fn print(
    format: Format,
    value: &Value,
    table_text: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let value = &az_shape(value);
    if let Some(found) = queried(value)? {
        let text = any_table(&found);
        return print_value(format, &found, || text);
    }
    print_value(format, value, table_text)
}

/// A resource as `az` prints it: the fields of `properties` lifted beside `id` and `name`, and
/// `resourceGroup` where the id names one; a list, each of its resources so. Anything else (a
/// forecast, a summary, a simulation) is printed as it is.
pub fn az_shape(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.iter().map(az_shape).collect()),
        Value::Object(fields) if fields.contains_key("id") => {
            let Some(Value::Object(properties)) = fields.get("properties") else {
                return value.clone();
            };
            let mut shaped = serde_json::Map::new();
            for (key, field) in fields {
                if key == "properties" {
                    for (inner, v) in properties {
                        shaped.entry(inner.clone()).or_insert_with(|| v.clone());
                    }
                } else {
                    shaped.insert(key.clone(), field.clone());
                }
            }
            let group = fields["id"].as_str().and_then(|id| {
                let mut segments = id.split('/');
                segments
                    .by_ref()
                    .find(|s| s.eq_ignore_ascii_case("resourceGroups"))?;
                segments.next().map(String::from)
            });
            if let Some(group) = group {
                shaped.insert("resourceGroup".into(), Value::String(group));
            }
            Value::Object(shaped)
        }
        other => other.clone(),
    }
}

fn print_value(
    format: Format,
    value: &Value,
    table_text: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match format {
        Format::Json | Format::Jsonc => outln!("{}", serde_json::to_string_pretty(value)?),
        Format::Yaml | Format::Yamlc => out!(
            "{}",
            serde_saphyr::to_string(value)
                .map_err(|e| anyhow::anyhow!("cannot write YAML: {e}"))?
        ),
        Format::Tsv => out!("{}", tsv(value)),
        Format::Table => out!("{}", table_text()),
        Format::None => {}
    }
    Ok(())
}

/// `az`'s `tsv`: a list is a line per item; an item is its scalar values in order, separated by
/// tabs (nested objects and lists are left out); a scalar is itself.
pub fn tsv(value: &Value) -> String {
    fn scalar(v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Null => Some(String::new()),
            Value::Bool(_) | Value::Number(_) => Some(v.to_string()),
            Value::Array(_) | Value::Object(_) => None,
        }
    }
    fn line(v: &Value) -> String {
        match v {
            Value::Object(m) => m.values().filter_map(scalar).collect::<Vec<_>>().join("\t"),
            Value::Array(items) => items
                .iter()
                .filter_map(scalar)
                .collect::<Vec<_>>()
                .join("\t"),
            other => scalar(other).unwrap_or_default(),
        }
    }
    let lines: Vec<String> = match value {
        Value::Array(items) => items.iter().map(line).collect(),
        other => vec![line(other)],
    };
    lines.into_iter().map(|l| l + "\n").collect()
}

pub fn default_format(asked: Option<Format>) -> Format {
    asked.unwrap_or(if std::io::stdout().is_terminal() {
        Format::Table
    } else {
        Format::Json
    })
}

#[cfg(test)]
mod tests {
    use super::arm_path;

    #[test]
    fn fleet_manager_s_resources_have_arm_paths_and_flotilla_s_own_keep_theirs() {
        let arm = |p: &str| arm_path(p, "sub", "rg");
        let base =
            "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.ContainerService/fleets";
        let v = "api-version=2025-03-01";
        assert_eq!(arm("/v1/fleets").as_deref(), Some(&*format!("{base}?{v}")));
        assert_eq!(
            arm("/v1/fleets/retail/members/canary").as_deref(),
            Some(&*format!("{base}/retail/members/canary?{v}"))
        );
        assert_eq!(
            arm("/v1/fleets/retail/updateRuns/r1/start").as_deref(),
            Some(&*format!("{base}/retail/updateRuns/r1/start?{v}"))
        );
        assert_eq!(
            arm("/v1/fleets/retail/gates?$filter=x").as_deref(),
            Some(&*format!("{base}/retail/gates?{v}&$filter=x"))
        );
        for own in [
            "/v1/fleets/retail/updateRuns/r1/events",
            "/v1/fleets/retail/updateRuns/r1/forecast",
            "/v1/fleets/retail/releases",
            "/v1/fleets/retail/members:import",
            "/v1/fleets/retail/members/canary/start",
            "/v1/me",
            "/v1/tokens",
        ] {
            assert_eq!(arm(own), None, "{own}");
        }
    }
}
