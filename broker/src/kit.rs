//! The contract kit (`provider/test`): being written.

use crate::dispatch::Cx;
use abx_protocol::AbxError;
use serde_json::Value;

/// `provider/test {id, filter?}`.
pub async fn run(cx: &Cx, params: Value) -> Result<Value, AbxError> {
    let _ = (cx, params);
    Err(AbxError::internal("the contract kit is not written yet"))
}
