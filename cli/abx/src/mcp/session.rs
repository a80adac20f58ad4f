//! What every tool call shares with the server: the protocol revision it is served under
//! ([`Era`]) and the server's stdout ([`Out`]).

use abx_protocol::message;
use serde_json::Value;
use tokio::sync::mpsc;

/// The protocol revision one request is served under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Era {
    /// A handshake revision (the negotiated one, or the newest when none was).
    Handshake(&'static str),
    /// 2026-07-28.
    Modern,
}

impl Era {
    /// Whether the revision has `outputSchema` / `structuredContent` and tool titles.
    pub fn structured(self) -> bool {
        match self {
            Era::Modern => true,
            Era::Handshake(v) => v >= "2025-06-18",
        }
    }

    /// Whether the revision has tool annotations.
    pub fn annotations(self) -> bool {
        match self {
            Era::Modern => true,
            Era::Handshake(v) => v >= "2025-03-26",
        }
    }
}

/// Lines for stdout, written in order by one writer task. MCP is JSON-RPC 2.0 too: every
/// envelope is encoded by `abx_protocol::message` (its `_any` encoder keeps MCP's ids as the
/// client sent them).
#[derive(Clone)]
pub struct Out(pub(super) mpsc::UnboundedSender<Vec<u8>>);

impl Out {
    /// Queue one encoded message body.
    pub fn send(&self, mut line: Vec<u8>) {
        line.push(b'\n');
        let _ = self.0.send(line);
    }

    /// Queue a notification.
    pub fn notify(&self, method: &str, params: Value) {
        self.send(message::encode_notification(method, Some(&params)));
    }
}
