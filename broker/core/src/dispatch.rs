//! The method table: every request method the broker serves, and its handler.

use crate::broker::Broker;
pub use crate::broker::Cx;
pub use crate::cx::{reply, Reply};
use crate::events::Info;
pub use crate::members::{params_value, MAX_MEMBERS};
use crate::members::{string_or_null, Members};
use crate::provider::{CallCx, Provider};
use abx_protocol::api::{
    self, methods, BrokerShutdownParams, InitializeParams, InitializeResult, NoParams, PeerInfo,
    ProviderIdParams,
};
use abx_protocol::features;
use abx_protocol::{AbxError, ErrorCode, PROTOCOL_VERSION};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::sync::Arc;

/// Parse params into `T`; absent params parse as `{}` so missing fields are named.
pub fn params<T: DeserializeOwned>(method: &str, p: Option<&RawValue>) -> Result<T, AbxError> {
    serde_json::from_str(p.map_or("{}", RawValue::get))
        .map_err(|e| AbxError::invalid_params(method, e))
}

/// By-name params only: JSON-RPC also allows by-position params (an array); an empty one
/// (what `vim.lsp.rpc` sends for an empty Lua table) means no params, any other array is
/// E1004 naming by-name params.
pub fn by_name(method: &str, p: Option<Box<RawValue>>) -> Result<Option<Box<RawValue>>, AbxError> {
    let Some(raw) = p else { return Ok(None) };
    match array_params(&raw) {
        None => return Ok(Some(raw)),
        Some(true) => return Ok(None),
        Some(false) => {}
    }
    let mut e = AbxError::invalid_params(
        method,
        "by-position params (an array) are not supported; send by-name params (an object)",
    );
    e.suggestion = format!(
        "Send \"params\" as an object with named members (see docs/broker-api.md for '{method}'), or [] / {{}} / nothing for no params."
    );
    Err(e)
}

/// True for params without members: `{}` or `[]` (whitespace inside allowed).
pub fn no_members(p: &RawValue) -> bool {
    let text = p.get().trim();
    let inner = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .or_else(|| text.strip_prefix('[').and_then(|t| t.strip_suffix(']')));
    inner.is_some_and(|t| t.trim().is_empty())
}

/// `Some(empty)` when params are by-position (an array), `None` for an object.
pub fn array_params(p: &RawValue) -> Option<bool> {
    let text = p.get().trim_start();
    let rest = text.strip_prefix('[')?;
    Some(rest.trim() == "]")
}

/// Every method the core answers itself, from the catalogue (`abx_protocol::catalogue::CORE`;
/// the composition root adds its own, see [`crate::broker::Methods`]; the provider methods
/// are [`features::PROVIDER_METHODS`]).
pub const METHODS: &[&str] = abx_protocol::catalogue::CORE;

/// Run one request. The params are taken by value so that a router can free them as soon as
/// it has parsed them (a 64 MiB `files/write` is then held once, not twice).
pub async fn call(cx: &Cx, method: &str, raw: Option<Box<RawValue>>) -> Reply {
    let raw = by_name(method, raw)?;
    if method.starts_with(TEST_PREFIX) {
        return test_hook(cx.broker.test_hooks, method);
    }
    if features::PROVIDER_METHODS.contains(&method) {
        return route(cx, method, raw).await;
    }
    let p = raw.as_deref();
    // The core's and the composition root's methods: small params, whose names are read
    // here once more (a method nobody serves is E1003 below, whatever its params). At most
    // MAX_MEMBERS names are read; params that are not an object are left to the typed parse.
    let served =
        METHODS.contains(&method) || cx.broker.methods.as_ref().is_some_and(|m| m.serves(method));
    if let Some(raw) = p {
        if served && raw.get().trim_start().starts_with('{') {
            let obj = Members::parse(method, raw)?;
            check_members(&cx.broker, method, obj.names(), false)?;
        }
    }
    // Their handlers read params into types that may hold maps of any values
    // (`provider/configure`'s `values`): large params are costed as a tree first, and that
    // cost counted while the handler runs (see `Members::plan`).
    let _counted = match p {
        Some(raw) if served && raw.get().len() > VALUE_SMALL => {
            tree_counted(method, raw, &cx.broker.pool)?
        }
        _ => None,
    };
    match method {
        methods::INITIALIZE => initialize(cx, params(method, p)?),
        methods::SHUTDOWN => reply(&()),
        methods::PING => ping(),
        methods::STATUS => status(&cx.broker),
        methods::BROKER_SHUTDOWN => broker_shutdown(cx, params(method, p)?),
        methods::SUBSCRIBE => {
            params::<NoParams>(method, p)?;
            cx.broker
                .events
                .subscribe(cx.conn.handle.clone(), cx.replied.clone());
            reply(&json!({}))
        }
        methods::UNSUBSCRIBE => {
            params::<NoParams>(method, p)?;
            cx.broker.events.unsubscribe(cx.conn.handle.id).await;
            reply(&json!({}))
        }
        "provider/list" => provider_list(cx),
        "provider/info" => provider_info(cx, params(method, p)?),
        methods::SANDBOX_LOG => crate::cmdlog::serve(cx, params(method, p)?).await,
        _ => match &cx.broker.methods {
            Some(m) if m.serves(method) => m.call(cx, method, raw).await,
            _ => Err(AbxError::new(
                ErrorCode::MethodNotFound,
                &[("method", method)],
            )),
        },
    }
}

/// Params up to this size are read by a handler without being costed first.
const VALUE_SMALL: usize = 64 * 1024;

/// The budget a tree of `raw` takes while a handler holds it: E1005 beyond an eighth of the
/// budget, E1013 when the budget has no room for it now (see [`Members::plan`]).
fn tree_counted(
    method: &str,
    raw: &RawValue,
    pool: &crate::outbound::Pool,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, AbxError> {
    let cost = abx_protocol::message::value_cost(raw.get())
        .map_err(|e| AbxError::invalid_params(method, e))?;
    let limit = pool.cap() / 8;
    if cost > limit {
        let mut e = AbxError::new(ErrorCode::MessageTooLarge, &[]);
        e.message = format!(
            "Params too large to read: '{method}' would hold {cost} bytes of them (the limit is {limit})."
        );
        e.suggestion = "Send fewer or smaller values.".into();
        return Err(e.with_data("limit", limit).with_data("size", cost));
    }
    if cost <= VALUE_SMALL {
        return Ok(None);
    }
    pool.try_take_exact(cost).map(Some).ok_or_else(|| {
        AbxError::new(
            ErrorCode::Busy,
            &[(
                "detail",
                &format!(
                    "the memory budget has no room now for the {cost} bytes the params of '{method}' take; it was not run"
                ),
            )],
        )
    })
}

/// Refuse the members `method` does not take (E1004 naming them), by the names of its params
/// type ([`api::params`]): before the method runs, and for a provider method before any
/// provider is chosen or called, so no provider (a plugin neither) ever sees a member the
/// API does not have. A routed method also takes `provider` (which provider serves it);
/// [`crate::broker::Settings::extra_members`] are taken everywhere. A method that is not in
/// the table parses its params itself.
fn check_members<'n>(
    b: &Broker,
    method: &str,
    names: impl Iterator<Item = &'n str>,
    routed: bool,
) -> Result<(), AbxError> {
    let Some(entry) = api::params::params_of(method) else {
        return Ok(());
    };
    let also: &[&str] = if routed { &["provider"] } else { &[] };
    entry.check(names.filter(|n| !b.extra_members.contains(n)), also)
}

/// Methods for the test suites, served only when the broker was made with
/// [`crate::broker::Settings::test_hooks`] (the daemon: `ABX_TEST_HOOKS=1`; never in normal
/// use): `$/abx/test/panic` panics in its handler.
const TEST_PREFIX: &str = "$/abx/test/";

fn test_hook(on: bool, method: &str) -> Reply {
    match method {
        "$/abx/test/panic" if on => panic!("test hook: a handler that panics"),
        _ => Err(AbxError::new(
            ErrorCode::MethodNotFound,
            &[("method", method)],
        )),
    }
}

/// `broker/ping`.
pub fn ping() -> Reply {
    Ok(RawValue::from_string("{}".to_owned()).expect("valid JSON"))
}

/// `broker/status`.
pub fn status(b: &Broker) -> Reply {
    reply(&json!({
        "version": b.version,
        "pid": std::process::id(),
        "uptimeMs": b.uptime_ms(),
        "startedAt": b.started_unix(),
        "connections": b.connections(),
        "subscribers": b.events.subscribers(),
        "inFlight": b.in_flight(),
        "socket": b.paths.socket,
        "dataDir": b.paths.data_dir,
        "logFile": b.paths.log_file(),
        "providers": b.registry.all().iter().map(|p| {
            let info = p.info();
            let proc_ = &info["process"];
            json!({
                "id": p.summary().id, "kind": p.summary().kind,
                "running": proc_.get("running").cloned().unwrap_or(json!(true)),
                "pid": proc_.get("pid").cloned().unwrap_or(Value::Null),
                "inFlight": proc_.get("inFlight").cloned().unwrap_or(json!(0)),
                "restarts": proc_.get("restarts").cloned().unwrap_or(json!(0)),
                "disabled": proc_.get("disabled").cloned().unwrap_or(Value::Null),
                "lastError": proc_.get("lastError").cloned().unwrap_or(Value::Null),
            })
        }).collect::<Vec<_>>(),
        "sandboxes": b.registry.all().iter().map(|p| p.sandbox_count()).sum::<usize>(),
    }))
}

fn initialize(cx: &Cx, p: InitializeParams) -> Reply {
    if let Some(ci) = p.client_info {
        *cx.conn.client.lock().expect("client lock") = Some(ci);
    }
    reply(&InitializeResult {
        protocol_version: PROTOCOL_VERSION.to_owned(),
        server_info: PeerInfo {
            name: "abx-broker".to_owned(),
            version: cx.broker.version.clone(),
        },
        capabilities: json!({
            "framings": ["line", "content-length"],
            "maxMessageSize": cx.broker.max_message,
            "methods": abx_protocol::catalogue::listed(
                cx.broker.methods.as_ref().map_or(&[], |m| m.names())
            ),
        }),
    })
}

fn broker_shutdown(cx: &Cx, p: BrokerShutdownParams) -> Reply {
    if p.if_idle && (cx.broker.connections() > 1 || cx.broker.in_flight() > 1) {
        return Err(AbxError::detail(
            ErrorCode::Busy,
            format!(
                "{} connections and {} requests are active",
                cx.broker.connections(),
                cx.broker.in_flight()
            ),
        )
        .with_suggestion("It stays up while in use; stop it later with 'abx broker stop'."));
    }
    tracing::info!("shutdown requested by connection {}", cx.conn.handle.id);
    // Answer first, then stop: the reply is queued before the token fires.
    let b = cx.broker.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        b.shutdown.cancel();
    });
    reply(&json!({}))
}

fn provider_list(cx: &Cx) -> Reply {
    let default = cx.broker.registry.default_id();
    let list: Vec<Value> = cx
        .broker
        .registry
        .all()
        .iter()
        .map(|p| {
            let s = p.summary();
            json!({
                "id": s.id, "name": s.name, "version": s.version, "kind": s.kind,
                "trust": s.trust, "features": s.features, "default": s.id == default,
            })
        })
        .collect();
    reply(&json!({ "providers": list }))
}

fn provider_info(cx: &Cx, p: ProviderIdParams) -> Reply {
    let prov = cx.broker.registry.get(&p.id)?;
    let s = prov.summary();
    let mut v = json!({
        "id": s.id, "name": s.name, "version": s.version, "kind": s.kind, "trust": s.trust,
        "features": s.features, "default": s.id == cx.broker.registry.default_id(),
        "description": s.description,
    });
    if let (Some(obj), Value::Object(extra)) = (v.as_object_mut(), prov.info()) {
        obj.extend(extra);
    }
    reply(&v)
}

/// Resolve a `sandbox` argument: `provider:id`, or a bare id (a provider that knows it, then
/// the index, then the providers asked, see [`crate::provider::probe_owners`]). Returns the
/// provider and its own id. A bare id two providers hold is ambiguous (E1004 naming them).
pub(crate) async fn resolve_sandbox(
    cx: &Cx,
    s: &str,
) -> Result<(Arc<dyn Provider>, String), AbxError> {
    let b = &cx.broker;
    if let Some((prov, id)) = s.split_once(':') {
        if let Ok(p) = b.registry.get(prov) {
            return Ok((p, id.to_owned()));
        }
    }
    if let Some(p) = b.registry.owner_of(s) {
        return Ok((p, s.to_owned()));
    }
    if let Some(pid) = b.index.get(s) {
        if let Ok(p) = b.registry.get(&pid) {
            return Ok((p, s.to_owned()));
        }
    }
    let ccx = CallCx {
        conn: cx.conn.handle.clone(),
        cancel: cx.cancel.clone(),
        replied: cx.replied.clone(),
        hold: cx.hold.clone(),
    };
    let mut found = crate::provider::probe_owners(&b.registry, &ccx, s).await;
    match found.len() {
        0 => Err(AbxError::new(ErrorCode::SandboxNotFound, &[("sandbox", s)])),
        1 => {
            let p = found.remove(0);
            b.index.insert(s, &p.summary().id);
            Ok((p, s.to_owned()))
        }
        _ => {
            let names: Vec<String> = found
                .iter()
                .map(|p| format!("{}:{s}", p.summary().id))
                .collect();
            Err(AbxError::invalid_params(
                "sandbox",
                format!(
                    "sandbox id '{s}' is ambiguous: it names {}",
                    names.join(" and ")
                ),
            )
            .with_suggestion(format!(
                "Name one of them as provider:id, e.g. '{}'.",
                names[0]
            ))
            .with_data("candidates", names))
        }
    }
}

/// Route a provider method: resolve, gate, rewrite, call, record.
async fn route(cx: &Cx, method: &str, p: Option<Box<RawValue>>) -> Reply {
    let b = &cx.broker;
    // The params' members stay raw, borrowed from the request: the broker reads the few it
    // routes on and rewrites `sandbox` (and drops `provider`); everything else reaches the
    // provider as it came, and params it did not change are passed on without a copy.
    let mut obj = match &p {
        Some(raw) => Members::parse(method, raw)?,
        None => Members::default(),
    };
    check_members(b, method, obj.names(), true)?;
    check_bounds(method, &obj)?;
    let explicit = match obj
        .remove("provider")
        .map(|r| string_or_null(&r).map(|s| s.map(Cow::into_owned)))
    {
        Some(Ok(s)) => s,
        None => None,
        Some(Err(())) => {
            return Err(AbxError::invalid_params(
                method,
                "provider must be a string",
            ))
        }
    };
    let str_member = |key: &str, what: &str| -> Result<Option<Cow<'_, str>>, AbxError> {
        match obj.get(key).map(string_or_null) {
            None => Ok(None),
            Some(Ok(Some(s))) => Ok(Some(s)),
            _ => Err(AbxError::invalid_params(
                method,
                format!("{what} must be a string"),
            )),
        }
    };
    let sandbox = str_member("sandbox", "sandbox")?;
    let (provider, local_id) = if let Some(s) = sandbox {
        let (prov, id) = match resolve_sandbox(cx, &s).await {
            Ok(r) => r,
            // Killing is idempotent: a sandbox that is gone is killed already.
            Err(e) if method == "sandbox/kill" && e.code == ErrorCode::SandboxNotFound => {
                return reply(&json!({"killed": false}));
            }
            Err(e) => return Err(e),
        };
        (prov, Some(id))
    } else if let Some(h) = match str_member("execId", "execId/watchId")? {
        Some(h) => Some(h),
        None => str_member("watchId", "execId/watchId")?,
    } {
        match b.handles.get(&h) {
            Some(pid) => (b.registry.get(&pid)?, None),
            None if obj.contains_key("execId") => {
                return Err(AbxError::new(ErrorCode::ExecNotFound, &[("exec", &h)]))
            }
            None => return Err(AbxError::invalid_params(method, format!("no watch '{h}'"))),
        }
    } else if method == "sandbox/list" && explicit.is_none() {
        return list_all(cx).await;
    } else {
        match &explicit {
            Some(id) => (b.registry.get(id)?, None),
            None => (b.registry.get(&b.registry.default_id())?, None),
        }
    };
    // Host paths the daemon reads or writes for the caller: the daemon's working directory
    // is nobody's, so they must be absolute (the caller's uid is the daemon's: the door
    // checked it, so the daemon's own file permissions are the caller's).
    let host_path = match method {
        "files/upload" | "files/download" => Some("localPath"),
        "templates/import" => Some("path"),
        _ => None,
    };
    if let Some(key) = host_path {
        if let Some(Ok(Some(lp))) = obj.get(key).map(string_or_null) {
            if !std::path::Path::new(&*lp).is_absolute() {
                return Err(AbxError::invalid_params(
                    method,
                    format!("{key} must be absolute, not '{lp}'"),
                ));
            }
        }
    }
    let summary = provider.summary();
    let has_pty =
        method == "exec/start" && obj.get("pty").is_some_and(|v| v.get().trim() != "null");
    // Host directories mounted into the sandbox need `storage.mount` (an empty list or null
    // asks for none).
    let has_mounts = method == "sandbox/create"
        && obj.get("mounts").is_some_and(|v| {
            let t = v.get().trim();
            t != "null" && !(t.starts_with('[') && t[1..].trim_start().starts_with(']'))
        });
    // A network policy (an object, not a mode string) needs `network.vpc`: a provider that
    // cannot enforce one refuses it (E8004), never ignores it.
    let has_policy = method == "sandbox/create"
        && obj
            .get("network")
            .is_some_and(|v| v.get().trim_start().starts_with('{'));
    for f in [
        features::for_method(method, has_pty),
        has_pty.then_some("exec.stream"),
        has_mounts.then_some("storage.mount"),
        has_policy.then_some("network.vpc"),
    ]
    .into_iter()
    .flatten()
    {
        if !summary.features.iter().any(|x| x == f) {
            return Err(crate::provider::unsupported(&summary.id, f));
        }
    }
    if let Some(id) = &local_id {
        obj.insert(
            "sandbox",
            serde_json::value::to_raw_value(id).map_err(AbxError::internal)?,
        );
    }

    // `sandbox/log`: a command's start is written before the provider sees it.
    let logged = crate::cmdlog::begin(cx, method, &summary.id, local_id.as_deref(), &obj, has_pty);
    let ccx = CallCx {
        conn: cx.conn.handle.clone(),
        cancel: cx.cancel.clone(),
        replied: cx.replied.clone(),
        hold: cx.hold.clone(),
    };
    // The request's params are freed before the call either way: a 64 MiB `data` is held
    // twice at most (the request's text and what the provider gets), and only while the
    // params are written out again.
    let res = if provider.takes_raw() {
        let written = match (&p, obj.changed()) {
            (Some(_), false) => None,
            _ => Some(obj.to_raw().map_err(AbxError::internal)?),
        };
        drop(obj);
        let params = match (written, p) {
            (None, Some(raw)) => raw,
            (written, p) => {
                drop(p);
                match written {
                    Some(params) => params,
                    None => reply(&serde_json::Map::new())?,
                }
            }
        };
        provider.call_raw(&ccx, method, params).await
    } else {
        // A provider that reads a tree: its cost counted before it is built, its largest
        // string made of the request's own buffer (never held twice).
        let base = p.as_deref().map_or("", RawValue::get);
        let plan = obj.plan(method, base, &b.pool)?;
        let (params, counted) = plan.finish(method, p)?;
        // The reply's budget this request lent is not the provider's to replace (it deposits
        // its own hold): kept aside, and merged with it after.
        let lent = cx.hold.lock().expect("hold").take();
        let res = provider.call(&ccx, method, params).await;
        drop(counted);
        if let Some(lent) = lent {
            let mut h = cx.hold.lock().expect("hold");
            match h.as_mut() {
                Some(mine) => mine.merge(lent),
                None => *h = Some(lent),
            }
        }
        res
    };
    if let Some(logged) = logged {
        logged.finish(method, &res);
    }
    match (&res, method) {
        (Ok(raw), "sandbox/create") => {
            if let Some(id) = reply_str(raw, "id") {
                b.index.insert(&id, &summary.id);
                b.events
                    .emit_info(&summary.id, &id, "created", object(raw).map(Info::Raw));
            }
        }
        (Ok(raw), "sandbox/kill") => {
            if let Some(id) = &local_id {
                b.index.remove(id);
                // Idempotent: a kill of what was gone already (`killed: false`) changes nothing.
                if reply_member(raw, "killed").is_none_or(|k| k.get().trim() != "false") {
                    b.events.emit(&summary.id, id, "killed", None);
                }
            }
        }
        (Ok(raw), "sandbox/pause" | "sandbox/resume" | "sandbox/setTimeout") => {
            if let Some(id) = &local_id {
                let change = match method {
                    "sandbox/pause" => "paused",
                    "sandbox/resume" => "resumed",
                    _ => "timeout",
                };
                b.events
                    .emit_info(&summary.id, id, change, object(raw).map(Info::Raw));
            }
        }
        (Ok(raw), "exec/start" | "files/watch") => {
            if let Some(h) = reply_str(raw, "execId").or_else(|| reply_str(raw, "watchId")) {
                b.handles.insert(&h, &summary.id);
            }
        }
        (Err(e), _) if e.code == ErrorCode::SandboxNotFound => {
            if let Some(id) = &local_id {
                b.index.remove(id);
            }
        }
        _ => {}
    }
    res
}

/// A reply that is an object (raw), else `None`.
fn object(raw: &RawValue) -> Option<&RawValue> {
    raw.get().trim_start().starts_with('{').then_some(raw)
}

/// The member `key` of a reply that is an object (the last of that name), raw: the reply is
/// read member by member, never made a tree (it may hold a sandbox's metadata).
fn reply_member<'r>(raw: &'r RawValue, key: &str) -> Option<&'r RawValue> {
    Members::parse("", object(raw)?).ok()?.get_borrowed(key)
}

/// A string member of a reply that is an object, else `None`.
fn reply_str(raw: &RawValue, key: &str) -> Option<String> {
    string_or_null(reply_member(raw, key)?)
        .ok()
        .flatten()
        .map(Cow::into_owned)
}

/// The upper bounds of the params that size a reply (the same for every provider). The
/// numbers are read as numbers, never as a tree of whatever was sent in their place.
fn check_bounds(method: &str, params: &Members<'_>) -> Result<(), AbxError> {
    let num = |k: &str| -> Result<Option<u64>, AbxError> {
        let Some(r) = params.get(k) else {
            return Ok(None);
        };
        let n: Option<serde_json::Number> = serde_json::from_str(r.get()).map_err(|_| {
            AbxError::invalid_params(
                method,
                format!("{k} must be a non-negative integer, not {:.40}", r.get()),
            )
        })?;
        match n {
            None => Ok(None),
            Some(n) => match n.as_u64() {
                Some(n) => Ok(Some(n)),
                // A number too large for u64 (1e30) is above the bound too.
                None if n.as_f64().is_some_and(|f| f > u64::MAX as f64) => Ok(Some(u64::MAX)),
                None => Err(AbxError::invalid_params(
                    method,
                    format!("{k} must be a non-negative integer, not {n}"),
                )),
            },
        }
    };
    match method {
        "files/read" => abx_protocol::limits::check_read_length(num("length")?),
        "exec/run" => abx_protocol::limits::check_max_output(num("maxOutput")?),
        _ => Ok(()),
    }
}

/// `sandbox/list` across providers: every healthy provider's sandboxes, and one entry in
/// `errors` per provider that could not answer (tampered, failing its handshake, its server
/// down, ...), so one bad provider never hides the others. The providers are asked at once.
async fn list_all(cx: &Cx) -> Reply {
    let ccx = CallCx {
        conn: cx.conn.handle.clone(),
        cancel: cx.cancel.clone(),
        replied: cx.replied.clone(),
        hold: cx.hold.clone(),
    };
    let providers: Vec<Arc<dyn Provider>> = cx.broker.registry.with_feature("sandbox.lifecycle");
    let replies = futures::future::join_all(
        providers
            .iter()
            .map(|p| async { p.call(&ccx, "sandbox/list", json!({})).await }),
    )
    .await;
    // The lists are joined as text: each provider's entries as it wrote them, never a tree
    // of them (a sandbox's metadata may be large).
    let mut out = br#"{"sandboxes":["#.to_vec();
    let mut first = true;
    let mut errors = Vec::new();
    for (p, r) in providers.iter().zip(replies) {
        match r {
            Ok(raw) => {
                let Some(list) = reply_member(&raw, "sandboxes") else {
                    continue;
                };
                let text = list.get().trim();
                let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) else {
                    continue;
                };
                let inner = inner.trim();
                if inner.is_empty() {
                    continue;
                }
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(inner.as_bytes());
            }
            // The caller gave up: that is the whole call's answer, not one provider's.
            Err(e) if e.code == ErrorCode::RequestCancelled => return Err(e),
            Err(e) => {
                tracing::warn!(provider = %p.summary().id, error = %e, "sandbox/list: provider failed");
                errors.push(json!({
                    "provider": p.summary().id,
                    "code": e.code.abx(),
                    "message": e.message,
                    "suggestion": e.suggestion,
                }));
            }
        }
    }
    out.push(b']');
    if !errors.is_empty() {
        out.extend_from_slice(br#","errors":"#);
        serde_json::to_writer(&mut out, &errors).map_err(AbxError::internal)?;
    }
    out.push(b'}');
    let text = String::from_utf8(out).map_err(AbxError::internal)?;
    RawValue::from_string(text).map_err(AbxError::internal)
}
