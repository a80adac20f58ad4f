//! What a handler gets ([`Cx`]) and gives ([`Reply`]).
//!
//! A handler sees the broker, its calling connection as a [`Caller`] (how to send to it and
//! who it is: never the connection loop itself), the request's cancellation token, the
//! token fired once its reply is queued, and the pool bytes that already count its reply.
//!
//! `Cx` is generic over the broker only so that this module needs nothing above it: the
//! broker holds the composition root's method table ([`crate::broker::Methods`]), whose
//! handlers get a `Cx` holding the broker, a recursive type that would otherwise tie the two
//! files in a circle. The core uses one instance, [`crate::broker::Cx`] (`Cx<Broker>`, also
//! named `abx_core::dispatch::Cx`).

use crate::outbound::{Hold, Outbound};
use abx_protocol::api::PeerInfo;
use abx_protocol::AbxError;
use serde::Serialize;
use serde_json::value::RawValue;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// What a handler gets: the broker, its caller and its cancellation token.
pub struct Cx<B> {
    /// Broker-wide state.
    pub broker: Arc<B>,
    /// The calling connection, as handlers see it.
    pub conn: Arc<Caller>,
    /// Cancelled by `$/cancelRequest` or when the connection goes away.
    pub cancel: CancellationToken,
    /// Fired once this request's reply is queued (streams wait for it, so a client always
    /// sees `exec/start`'s reply before the stream's first notification).
    pub replied: CancellationToken,
    /// Pool bytes that already count this request's reply (deposited by its handler).
    pub hold: Hold,
}

/// A connection as its handlers see it: one per connection, shared by its requests.
pub struct Caller {
    /// How to send to this connection.
    pub handle: Outbound,
    /// Who connected, from `initialize`.
    pub client: Mutex<Option<PeerInfo>>,
}

impl Caller {
    /// The caller behind `handle`, not introduced yet.
    pub fn new(handle: Outbound) -> Caller {
        Caller {
            handle,
            client: Mutex::new(None),
        }
    }
}

/// A handler's result: raw JSON, so no `Value` tree is ever built for big results.
pub type Reply = Result<Box<RawValue>, AbxError>;

/// Serialize a result.
pub fn reply<T: Serialize + ?Sized>(v: &T) -> Reply {
    serde_json::value::to_raw_value(v).map_err(AbxError::internal)
}
