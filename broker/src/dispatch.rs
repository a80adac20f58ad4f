//! The method table: every request method the broker serves, and its handler.

use crate::conn::Conn;
use crate::state::Broker;
use abx_protocol::api::{
    methods, BrokerShutdownParams, InitializeParams, InitializeResult, PeerInfo,
};
use abx_protocol::{AbxError, ErrorCode, PROTOCOL_VERSION};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;
use serde_json::value::RawValue;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What a handler gets: the broker, its connection and its cancellation token.
pub struct Cx {
    /// Broker-wide state.
    pub broker: Arc<Broker>,
    /// The calling connection.
    pub conn: Arc<Conn>,
    /// Cancelled by `$/cancelRequest` or when the connection goes away.
    pub cancel: CancellationToken,
}

/// A handler's result: raw JSON, so no `Value` tree is ever built for big results.
pub type Reply = Result<Box<RawValue>, AbxError>;

/// Serialize a result.
pub fn reply<T: Serialize + ?Sized>(v: &T) -> Reply {
    serde_json::value::to_raw_value(v).map_err(AbxError::internal)
}

/// Parse params into `T`; absent params parse as `{}` so missing fields are named.
pub fn params<T: DeserializeOwned>(method: &str, p: Option<&RawValue>) -> Result<T, AbxError> {
    serde_json::from_str(p.map_or("{}", RawValue::get))
        .map_err(|e| AbxError::invalid_params(method, e))
}

/// Every method the broker answers (for `initialize` capabilities and docs).
pub const METHODS: &[&str] = &[
    methods::INITIALIZE,
    methods::SHUTDOWN,
    methods::PING,
    methods::STATUS,
    methods::BROKER_SHUTDOWN,
];

/// Run one request.
pub async fn call(cx: &Cx, method: &str, p: Option<&RawValue>) -> Reply {
    match method {
        methods::INITIALIZE => initialize(cx, params(method, p)?),
        methods::SHUTDOWN => reply(&()),
        methods::PING => ping(),
        methods::STATUS => status(&cx.broker),
        methods::BROKER_SHUTDOWN => broker_shutdown(cx, params(method, p)?),
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
        "inFlight": b.in_flight(),
        "socket": b.paths.socket,
        "dataDir": b.paths.data_dir,
        "logFile": b.paths.log_file(),
        "providers": [],
        "sandboxes": 0,
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
            "methods": METHODS,
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
