//! `secrets/*`: the broker's secret store for egress headers (the store itself is
//! `abx_egress::SecretStore`, a 0600 file of the config dir). A value is never returned,
//! logged or put in an error: errors name the key and what is wrong, never the value.

use abx_egress::secrets::{check_value, valid_key, SecretStore};
use abx_protocol::api::{methods, SecretKeyParams, SecretList, SecretRemoved, SecretSetParams};
use abx_protocol::AbxError;
use serde_json::Value;
use std::sync::Arc;

fn bad_key(method: &str, key: &str) -> AbxError {
    let shown: String = key.chars().take(64).flat_map(char::escape_debug).collect();
    AbxError::invalid_params(
        method,
        format!(
            "the key '{shown}' is not a secret key (letters, digits, '_', '-', '.'; at most 128)"
        ),
    )
}

/// `secrets/set`: written to the file before it is answered.
pub async fn set(store: &Arc<SecretStore>, p: SecretSetParams) -> Result<Value, AbxError> {
    const M: &str = methods::SECRETS_SET;
    let SecretSetParams { key, value } = p;
    let value = zeroize::Zeroizing::new(value);
    if !valid_key(&key) {
        return Err(bad_key(M, &key));
    }
    if let Err(why) = check_value(&value) {
        return Err(AbxError::invalid_params(
            M,
            format!("secret '{key}': {why}"),
        ));
    }
    let store = store.clone();
    let k = key.clone();
    let v = (*value).clone();
    drop(value);
    tokio::task::spawn_blocking(move || store.set(&k, v))
        .await
        .map_err(AbxError::internal)?
        .map_err(|e| AbxError::internal(format!("storing secret '{key}': {e}")))?;
    tracing::info!(key = %key, "egress secret set");
    Ok(serde_json::json!({}))
}

/// `secrets/list`: the keys only.
pub fn list(store: &SecretStore) -> Value {
    serde_json::to_value(SecretList { keys: store.keys() }).unwrap_or_default()
}

/// `secrets/remove`.
pub async fn remove(store: &Arc<SecretStore>, p: SecretKeyParams) -> Result<Value, AbxError> {
    if !valid_key(&p.key) {
        return Err(bad_key(methods::SECRETS_REMOVE, &p.key));
    }
    let store = store.clone();
    let k = p.key.clone();
    let removed = tokio::task::spawn_blocking(move || store.remove(&k))
        .await
        .map_err(AbxError::internal)?
        .map_err(|e| AbxError::internal(format!("removing secret '{}': {e}", p.key)))?;
    if removed {
        tracing::info!(key = %p.key, "egress secret removed");
    }
    Ok(serde_json::to_value(SecretRemoved { removed }).unwrap_or_default())
}
