//! The contract kit (`provider/test {id, filter?}`): proves a provider keeps the broker API's
//! contract, end to end.
//!
//! The kit is a client of the broker API and nothing else (it links `abx-protocol`, never
//! the core): every test opens connections through the [`Connector`] it was given
//! ([`client::Client`]; the daemon's connector is a `tokio::io::duplex` served by its
//! connection loop) and speaks line-framed JSON-RPC through them, so each call goes
//! through framing, routing, feature gating and the provider exactly as a socket client's
//! would. What only the daemon knows (the provider's features and secret config values) it
//! passes in as a [`Target`].
//!
//! - Tests run concurrently (at most `concurrency`, default 16, slow ones started first);
//!   each creates its own sandboxes (lifetime 120 s) and the runner kills every one of them
//!   afterwards, whatever happened (failure, panic, timeout; if the whole request is dropped,
//!   a guard kills them from a spawned task).
//! - Each test has 30 s: a hung provider fails that test, not the kit.
//! - A test needing a feature the provider does not declare is `skipped` with
//!   `provider does not declare X`; every feature a provider can declare is exercised by
//!   some test ([`COVERAGE`]).
//! - While running, the caller gets `provider/testResult {id, name, outcome, detail?,
//!   durationMs}` per finished test; the reply lists every selected test in table order.

mod client;
mod code;
mod exec;
mod files;
mod sandbox;
mod schema;

use abx_protocol::{AbxError, ErrorCode};
use client::{Client, RpcErr, Waiting};
pub use client::{Connector, Halves};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Time one test may take.
const TEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Time the cleanup of one test's sandboxes may take.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(15);
/// Lifetime of the kit's sandboxes: if everything else fails, they expire soon.
const SANDBOX_TIMEOUT: u64 = 120;
/// Tests running at once by default.
const DEFAULT_CONCURRENCY: usize = 16;

/// How a test ended when it did not fail.
pub enum Done {
    /// It passed (with an optional note).
    Passed(Option<String>),
    /// It could not run here.
    Skipped(String),
}

/// A test's result: `Err` is a failure with its reason.
pub type Outcome = Result<Done, String>;

/// Pass.
pub fn pass() -> Outcome {
    Ok(Done::Passed(None))
}

type TestFn = for<'a> fn(&'a T) -> BoxFuture<'a, Outcome>;

/// One test of the kit.
pub struct Test {
    /// Its name (`test_...`).
    pub name: &'static str,
    /// Features it needs; skipped when one is not declared.
    pub needs: &'static [&'static str],
    /// Takes about a second on purpose (lifetimes, timeouts): started first.
    pub slow: bool,
    run: TestFn,
}

macro_rules! test {
    ($name:literal, $f:path, [$($need:literal),*]) => {
        Test { name: $name, needs: &[$($need),*], slow: false, run: |t| Box::pin($f(t)) }
    };
    ($name:literal, $f:path, [$($need:literal),*], slow) => {
        Test { name: $name, needs: &[$($need),*], slow: true, run: |t| Box::pin($f(t)) }
    };
}

/// Fail the test with a formatted reason unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}
pub(crate) use ensure;

/// Every test, in the order results are reported: the seed's eighteen, then the rest.
pub static TESTS: &[Test] = &[
    test!(
        "test_declared_features_are_known",
        sandbox::declared_features_are_known,
        []
    ),
    test!(
        "test_describe_never_exposes_secret_defaults",
        sandbox::describe_never_exposes_secret_defaults,
        []
    ),
    test!("test_lifecycle", sandbox::lifecycle, ["sandbox.lifecycle"]),
    test!(
        "test_kill_is_idempotent",
        sandbox::kill_is_idempotent,
        ["sandbox.lifecycle"]
    ),
    test!(
        "test_set_timeout",
        sandbox::set_timeout,
        ["sandbox.lifecycle", "sandbox.timeout"]
    ),
    test!(
        "test_pause_resume",
        sandbox::pause_resume,
        ["sandbox.lifecycle", "sandbox.pause"]
    ),
    test!(
        "test_exec_run",
        exec::exec_run,
        ["sandbox.lifecycle", "exec.run"]
    ),
    test!(
        "test_exec_exit_code_stderr_and_env",
        exec::exit_code_stderr_and_env,
        ["sandbox.lifecycle", "exec.run"]
    ),
    test!(
        "test_exec_stream_order_and_single_exit",
        exec::stream_order_and_single_exit,
        ["sandbox.lifecycle", "exec.stream"]
    ),
    test!(
        "test_exec_timeout_is_enforced",
        exec::timeout_is_enforced,
        ["sandbox.lifecycle", "exec.run"],
        slow
    ),
    test!(
        "test_process_list",
        exec::process_list,
        ["sandbox.lifecycle", "process.manage"]
    ),
    test!(
        "test_files_roundtrip",
        files::roundtrip,
        ["sandbox.lifecycle", "files.rw"]
    ),
    test!(
        "test_files_binary_and_unicode",
        files::binary_and_unicode,
        ["sandbox.lifecycle", "files.rw"]
    ),
    test!(
        "test_files_directory_operations",
        files::directory_operations,
        ["sandbox.lifecycle", "files.rw"]
    ),
    test!(
        "test_missing_file_is_a_typed_not_found",
        files::missing_file_is_a_typed_not_found,
        ["sandbox.lifecycle", "files.rw"]
    ),
    test!(
        "test_ports_url",
        sandbox::ports_url,
        ["sandbox.lifecycle", "ports.url"]
    ),
    test!(
        "test_undeclared_feature_fails_with_e8004",
        sandbox::undeclared_feature_fails_with_e8004,
        []
    ),
    test!(
        "test_secret_options_are_redacted_from_errors",
        sandbox::secret_options_are_redacted_from_errors,
        []
    ),
    test!(
        "test_exec_stdin_and_eof",
        exec::stdin_and_eof,
        ["sandbox.lifecycle", "exec.stream"]
    ),
    test!(
        "test_pty_and_resize",
        exec::pty_and_resize,
        ["sandbox.lifecycle", "exec.stream", "pty"]
    ),
    test!(
        "test_exec_attach_after_reconnect",
        exec::attach_after_reconnect,
        ["sandbox.lifecycle", "exec.stream"]
    ),
    test!(
        "test_cancellation",
        exec::cancellation,
        ["sandbox.lifecycle", "exec.run"]
    ),
    test!(
        "test_large_file_in_chunks",
        files::large_file_in_chunks,
        ["sandbox.lifecycle", "files.rw"],
        slow
    ),
    test!(
        "test_files_upload_download",
        files::upload_download,
        ["sandbox.lifecycle", "files.rw"]
    ),
    test!(
        "test_files_watch",
        files::watch,
        ["sandbox.lifecycle", "files.watch"]
    ),
    test!(
        "test_connect_keeps_lifetime",
        sandbox::connect_keeps_lifetime,
        ["sandbox.lifecycle", "sessions"],
        slow
    ),
    test!(
        "test_concurrent_calls_from_two_clients",
        exec::concurrent_calls_from_two_clients,
        ["sandbox.lifecycle", "exec.run"]
    ),
    test!(
        "test_unicode_everywhere",
        exec::unicode_everywhere,
        ["sandbox.lifecycle", "exec.run"]
    ),
    test!(
        "test_timeout_kills_children",
        exec::timeout_kills_children,
        ["sandbox.lifecycle", "exec.run"],
        slow
    ),
    test!(
        "test_capabilities_match_features",
        sandbox::capabilities_match_features,
        ["sandbox.lifecycle"]
    ),
    test!(
        "test_system_info",
        sandbox::system_info,
        ["sandbox.lifecycle"]
    ),
    test!(
        "test_code_run",
        sandbox::code_run,
        ["sandbox.lifecycle", "code.interpret"]
    ),
    test!(
        "test_code_state_kept",
        code::state_kept,
        ["sandbox.lifecycle", "code.interpret"]
    ),
    test!(
        "test_code_error_shape",
        code::error_shape,
        ["sandbox.lifecycle", "code.interpret"]
    ),
    test!(
        "test_code_cancel_keeps_state",
        code::cancel_keeps_state,
        ["sandbox.lifecycle", "code.interpret"]
    ),
    test!(
        "test_code_rich_result",
        code::rich_result,
        ["sandbox.lifecycle", "code.interpret"]
    ),
    test!(
        "test_templates_list",
        sandbox::templates_list,
        ["templates.read"]
    ),
    test!(
        "test_templates_build_is_typed",
        sandbox::templates_build_is_typed,
        ["templates.build"]
    ),
];

/// Which test exercises each feature a provider may declare. Features without methods of
/// their own (options of other methods) are checked by `test_declared_features_are_known`
/// and `test_capabilities_match_features`.
pub const COVERAGE: &[(&str, &str)] = &[
    ("sandbox.lifecycle", "test_lifecycle"),
    ("sandbox.timeout", "test_set_timeout"),
    ("sandbox.pause", "test_pause_resume"),
    ("sessions", "test_connect_keeps_lifetime"),
    ("exec.run", "test_exec_run"),
    ("exec.stream", "test_exec_stream_order_and_single_exit"),
    ("pty", "test_pty_and_resize"),
    ("process.manage", "test_process_list"),
    ("files.rw", "test_files_roundtrip"),
    ("files.watch", "test_files_watch"),
    ("files.transfer", "test_files_upload_download"),
    ("code.interpret", "test_code_run"),
    ("templates.read", "test_templates_list"),
    ("templates.build", "test_templates_build_is_typed"),
    ("ports.url", "test_ports_url"),
    ("ports.domain", "test_capabilities_match_features"),
    ("storage.mount", "test_capabilities_match_features"),
    ("network.vpc", "test_capabilities_match_features"),
];

/// `provider/test` params: the API type.
pub type Params = abx_protocol::api::ProviderTestParams;

/// The provider under test, as the daemon knows it.
pub struct Target {
    /// Its id.
    pub id: String,
    /// Its declared features.
    pub features: Vec<String>,
    /// Effective values of its secret config keys (plugins only): `(key, value)`; the kit
    /// checks that no reply or error ever shows one.
    pub secrets: KeyValues,
    /// Defaults of its secret config keys as the installed manifest has them.
    pub secret_defaults: KeyValues,
}

/// What every test of one run shares.
pub struct Kit {
    connector: Arc<dyn Connector>,
    /// The provider under test.
    pub id: String,
    /// Its declared features.
    pub features: Vec<String>,
    /// Effective values of its secret config keys (plugins only): `(key, value)`.
    pub secrets: KeyValues,
    /// Defaults of its secret config keys as the installed manifest has them.
    pub secret_defaults: KeyValues,
    /// The template of the run's sandboxes (`provider/test {template}`).
    pub template: Option<String>,
}

/// One test's view: the kit, its sandboxes, what it is waiting for.
pub struct T {
    /// Shared facts.
    pub kit: Arc<Kit>,
    sandboxes: Tracker,
    waiting: Waiting,
}

/// A sandbox a test created.
pub struct Sb {
    /// `provider:id`, as clients address it.
    pub id: String,
    /// The provider's own id.
    pub local: String,
    /// What sandbox/create answered.
    pub info: Value,
}

impl T {
    /// A new connection to the broker.
    pub fn client(&self) -> Client {
        Client::connect(&*self.kit.connector, self.waiting.clone())
    }

    /// The provider id.
    pub fn id(&self) -> &str {
        &self.kit.id
    }

    /// Whether the provider declares a feature.
    pub fn has(&self, f: &str) -> bool {
        self.kit.features.iter().any(|x| x == f)
    }

    /// Create a sandbox of the provider (lifetime 120 s unless `extra` says otherwise);
    /// it is killed when the test ends.
    pub async fn create(&self, extra: Value) -> Result<Sb, String> {
        let mut p = json!({"provider": self.kit.id, "timeout": SANDBOX_TIMEOUT});
        if let (Some(o), Some(t)) = (p.as_object_mut(), &self.kit.template) {
            o.insert("template".into(), json!(t));
        }
        if let (Some(o), Value::Object(x)) = (p.as_object_mut(), extra) {
            o.extend(x);
        }
        let info = self
            .create_raw(p)
            .await
            .map_err(|e| format!("sandbox/create failed: {e}"))?;
        let local = info["id"].as_str().unwrap_or_default().to_owned();
        ensure!(
            !local.is_empty(),
            "sandbox/create answered no id: {}",
            client::short(&info.to_string())
        );
        let id = format!("{}:{local}", self.kit.id);
        Ok(Sb { id, local, info })
    }

    /// `sandbox/create` with exactly these params. Whatever it creates is killed when the
    /// test ends, also when the test is dropped while the call is in flight: the call runs
    /// on a task of its own that records the sandbox (or kills it, if the test is over).
    pub async fn create_raw(&self, params: Value) -> Result<Value, RpcErr> {
        let connector = self.kit.connector.clone();
        let state = self.sandboxes.state.clone();
        let provider = self.kit.id.clone();
        let waiting = self.waiting.clone();
        let task = tokio::spawn(async move {
            let c = Client::connect(&*connector, waiting);
            let r = c.call("sandbox/create", params).await;
            if let Some(local) = r.as_ref().ok().and_then(|v| v["id"].as_str()) {
                let id = format!("{provider}:{local}");
                let over = {
                    let mut st = state.lock().expect("tracker");
                    if !st.over {
                        st.ids.push(id.clone());
                    }
                    st.over
                };
                if over {
                    kill_all(&*connector, vec![id]).await;
                }
            }
            r
        });
        task.await.unwrap_or_else(|e| {
            Err(RpcErr {
                code: 0,
                abx: String::new(),
                message: format!("sandbox/create panicked: {e}"),
                raw: Value::Null,
            })
        })
    }
}

#[derive(Default)]
struct Tracked {
    ids: Vec<String>,
    /// The test has ended: sandboxes created from now on are killed at once.
    over: bool,
}

/// The sandboxes of one test; whatever is left when it is dropped is killed by a task.
struct Tracker {
    connector: Arc<dyn Connector>,
    state: Arc<Mutex<Tracked>>,
}

impl Tracker {
    fn end(&self) -> Vec<String> {
        let mut st = self.state.lock().expect("tracker");
        st.over = true;
        std::mem::take(&mut st.ids)
    }

    /// Kill every sandbox of the test (on a task: a dropped caller does not stop it).
    async fn cleanup(&self) {
        let ids = self.end();
        if ids.is_empty() {
            return;
        }
        let connector = self.connector.clone();
        let _ = tokio::spawn(async move { kill_all(&*connector, ids).await }).await;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let ids = self.end();
        if ids.is_empty() {
            return;
        }
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            let connector = self.connector.clone();
            h.spawn(async move { kill_all(&*connector, ids).await });
        }
    }
}

async fn kill_all(connector: &dyn Connector, ids: Vec<String>) {
    if ids.is_empty() {
        return;
    }
    let c = Client::connect(connector, Default::default());
    let kills = ids.iter().map(|id| {
        let c = &c;
        async move {
            match tokio::time::timeout(
                CLEANUP_TIMEOUT,
                c.call("sandbox/kill", json!({"sandbox": id})),
            )
            .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.is(&["E2009"]) => {}
                Ok(Err(e)) => tracing::debug!(sandbox = %id, "kit cleanup: kill failed: {e}"),
                Err(_) => tracing::warn!(sandbox = %id, "kit cleanup: kill did not answer"),
            }
        }
    });
    futures::future::join_all(kills).await;
}

/// `(config key, value)` pairs.
pub type KeyValues = Vec<(String, String)>;

fn selected(filter: Option<&str>) -> Result<Vec<usize>, AbxError> {
    let parts: Vec<&str> = filter
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let picked: Vec<usize> = TESTS
        .iter()
        .enumerate()
        .filter(|(_, t)| parts.is_empty() || parts.iter().any(|p| t.name.contains(p)))
        .map(|(i, _)| i)
        .collect();
    if picked.is_empty() {
        return Err(AbxError::invalid_params(
            "provider/test",
            format!("filter '{}' matches no test", filter.unwrap_or_default()),
        )
        .with_suggestion(format!(
            "Give a substring of a test name, or several separated by commas; the tests: {}.",
            TESTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(picked)
}

/// Errors of the first call that mean the provider cannot be tested at all.
const FATAL: &[&str] = &[
    "E8001", "E8002", "E8003", "E8006", "E8007", "E8011", "E8014", "E8016",
];

/// `provider/test {id, filter?, concurrency?}` against `target`, through `connector`;
/// `on_result` gets each finished test's result (the daemon sends it as a
/// `provider/testResult` notification).
pub async fn run<F, Fut>(
    connector: Arc<dyn Connector>,
    target: Target,
    p: Params,
    on_result: F,
) -> Result<Value, AbxError>
where
    F: Fn(Value) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let picked = selected(p.filter.as_deref())?;
    let kit = Arc::new(Kit {
        connector: connector.clone(),
        id: target.id,
        features: target.features,
        secrets: target.secrets,
        secret_defaults: target.secret_defaults,
        template: p.template.clone(),
    });

    // A first cheap call: a provider that cannot start (integrity, handshake, config) is
    // an error of the whole run, not 30 failed tests.
    if kit.features.iter().any(|f| f == "sandbox.lifecycle") {
        let c = Client::connect(&*connector, Default::default());
        let first = c.call("sandbox/list", json!({"provider": kit.id}));
        // A provider that does not answer at all fails its tests one by one instead.
        if let Ok(Err(e)) = tokio::time::timeout(TEST_TIMEOUT, first).await {
            if e.is(FATAL) {
                return Err(to_abx(&e));
            }
        }
    }

    let started = Instant::now();
    let mut order = picked.clone();
    order.sort_by_key(|&i| !TESTS[i].slow);
    let concurrency = p.concurrency.unwrap_or(DEFAULT_CONCURRENCY).max(1);
    let mut results: Vec<(usize, Value)> = Vec::with_capacity(picked.len());
    let mut runs = futures::stream::iter(order)
        .map(|i| {
            let kit = kit.clone();
            async move { (i, run_one(kit, &TESTS[i]).await) }
        })
        .buffer_unordered(concurrency);
    while let Some((i, r)) = runs.next().await {
        let mut note = json!({"id": kit.id});
        if let (Some(n), Some(o)) = (note.as_object_mut(), r.as_object()) {
            n.extend(o.clone());
        }
        on_result(note).await;
        results.push((i, r));
    }
    results.sort_by_key(|(i, _)| *i);
    let count = |o: &str| results.iter().filter(|(_, r)| r["outcome"] == o).count();
    let (passed, failed, skipped) = (count("passed"), count("failed"), count("skipped"));
    tracing::info!(
        provider = %kit.id,
        passed, failed, skipped,
        ms = started.elapsed().as_millis() as u64,
        "contract kit finished"
    );
    Ok(json!({
        "id": kit.id,
        "results": results.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
        "passed": passed,
        "failed": failed,
        "skipped": skipped,
        "durationMs": started.elapsed().as_millis() as u64,
        "concurrency": concurrency,
    }))
}

fn to_abx(e: &RpcErr) -> AbxError {
    match ErrorCode::from_abx(&e.abx) {
        Some(code) => AbxError {
            code,
            message: e.message.clone(),
            suggestion: e.raw["data"]["suggestion"]
                .as_str()
                .unwrap_or(code.suggestion())
                .to_owned(),
            data: Default::default(),
        },
        None => AbxError::internal(e),
    }
}

async fn run_one(kit: Arc<Kit>, test: &'static Test) -> Value {
    let started = Instant::now();
    let missing: Vec<&str> = test
        .needs
        .iter()
        .copied()
        .filter(|f| !kit.features.iter().any(|x| x == f))
        .collect();
    let result = |outcome: &str, detail: Option<String>, ms: u128| {
        let mut v = json!({"name": test.name, "outcome": outcome, "durationMs": ms as u64});
        if let Some(d) = detail {
            v["detail"] = Value::String(d);
        }
        v
    };
    if !missing.is_empty() {
        return result(
            "skipped",
            Some(format!("provider does not declare {}", missing.join(", "))),
            0,
        );
    }
    let t = T {
        sandboxes: Tracker {
            connector: kit.connector.clone(),
            state: Default::default(),
        },
        kit,
        waiting: Default::default(),
    };
    let run = AssertUnwindSafe((test.run)(&t)).catch_unwind();
    let outcome = match tokio::time::timeout(TEST_TIMEOUT, run).await {
        Err(_) => Err(format!(
            "timed out after {} s waiting for {}",
            TEST_TIMEOUT.as_secs(),
            t.waiting.lock().expect("waiting")
        )),
        Ok(Err(panic)) => Err(format!(
            "the test panicked: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
        Ok(Ok(o)) => o,
    };
    let ms = started.elapsed().as_millis();
    t.sandboxes.cleanup().await;
    match outcome {
        Ok(Done::Passed(d)) => result("passed", d, ms),
        Ok(Done::Skipped(d)) => result("skipped", Some(d), ms),
        Err(d) => result("failed", Some(d), ms),
    }
}

/// Parse an RFC 3339 time (`2026-11-29T18:29:56Z`, fractions and offsets allowed) to unix
/// seconds.
pub fn parse_time(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut frac = 0.0;
    if let Some(r) = rest.strip_prefix('.') {
        let digits = r.bytes().take_while(u8::is_ascii_digit).count();
        frac = format!("0.{}", &r[..digits]).parse().ok()?;
        rest = &r[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (o[1..3].parse::<i64>().ok()? * 3600 + o[4..6].parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + mi * 60 + sec - offset) as f64 + frac)
}

/// Now, unix seconds.
pub fn now() -> f64 {
    abx_home::util::now_ms() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_feature_is_covered_by_a_test_that_needs_it() {
        for f in abx_protocol::features::ALL {
            let (_, name) = COVERAGE
                .iter()
                .find(|(x, _)| x == f)
                .unwrap_or_else(|| panic!("no test covers {f}"));
            let t = TESTS.iter().find(|t| t.name == *name).expect("listed test");
            assert!(
                t.needs.contains(f)
                    || matches!(
                        *f,
                        "files.transfer" | "ports.domain" | "storage.mount" | "network.vpc"
                    ),
                "{name} does not need {f}"
            );
        }
    }

    #[test]
    fn names_are_unique_and_the_seed_ones_come_first() {
        let names: Vec<&str> = TESTS.iter().map(|t| t.name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        assert_eq!(names[0], "test_declared_features_are_known");
        assert_eq!(names[17], "test_secret_options_are_redacted_from_errors");
    }

    #[test]
    fn filters() {
        assert_eq!(selected(None).unwrap().len(), TESTS.len());
        assert_eq!(selected(Some("")).unwrap().len(), TESTS.len());
        let one = selected(Some("test_lifecycle")).unwrap();
        assert_eq!(one.len(), 1);
        let two = selected(Some("test_lifecycle, kill_is")).unwrap();
        assert_eq!(two.len(), 2);
        assert!(selected(Some("files")).unwrap().len() > 3);
        assert_eq!(
            selected(Some("nothing-like-this")).unwrap_err().code,
            ErrorCode::InvalidParams
        );
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_time("2026-11-29T17:00:00Z"), Some(1_795_971_600.0));
        assert_eq!(parse_time("2000-02-29T00:00:00Z"), Some(951_782_400.0));
        assert_eq!(parse_time("2000-02-29T01:00:00+01:00"), Some(951_782_400.0));
        assert_eq!(parse_time("2000-02-29T00:00:00.5Z"), Some(951_782_400.5));
        assert_eq!(
            parse_time("2026-10-13 12:49:26.518486+00:00").map(|t| t.floor()),
            Some(1_791_895_766.0)
        );
        assert_eq!(parse_time("yesterday"), None);
        for s in [0i64, 951_782_400, 1_795_971_600, 4_107_587_696] {
            assert_eq!(parse_time(&abx_home::util::rfc3339(s)), Some(s as f64));
        }
    }
}
