//! Bounds on what one client can make the daemon hold (docs/broker-api.md, "Limits").
//!
//! Every reply's bytes are reserved from its connection's outbound budget before the work
//! that produces it ([`reply_reserve`]); the parameters that size a reply have upper bounds
//! ([`MAX_READ_LENGTH`], [`MAX_EXEC_OUTPUT`]); a batch has at most [`MAX_BATCH`] elements;
//! a plugin's reply to one call is at most [`plugin_reply_bound`] bytes.

use crate::error::{AbxError, ErrorCode};
use serde_json::value::RawValue;

/// Requests (and notifications) in one batch.
pub const MAX_BATCH: usize = 1024;
/// The largest `files/read` `length` (and its default): larger reads go in chunks.
pub const MAX_READ_LENGTH: u64 = 4 * 1024 * 1024;
/// The largest `exec/run` `maxOutput` (bytes kept per captured stream; also its default).
pub const MAX_EXEC_OUTPUT: u64 = 16 * 1024 * 1024;
/// Reply bytes reserved for a request whose reply is small (ids, acks, short lists).
pub const SMALL_REPLY: usize = 4 * 1024;
/// Reply bytes reserved for an `exec/run`: its output size is unknown until it ends, and
/// reserving the worst case (two streams of `maxOutput` as base64) would let a connection
/// run one command at a time (agents run many at once: 1024 of these fit in the budget).
/// The rest is reserved when the reply is queued.
pub const EXEC_RUN_RESERVE: usize = 16 * 1024;
/// The largest reply a plugin may send to a call other than `exec/run` and `files/read`.
pub const PLUGIN_REPLY_MAX: usize = 4 * 1024 * 1024;

/// Bytes of `n` bytes as base64.
pub const fn base64_len(n: u64) -> u64 {
    n.div_ceil(3) * 4
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Sizing {
    #[serde(default)]
    length: Option<u64>,
    #[serde(default)]
    max_output: Option<u64>,
    #[serde(default)]
    recursive: Option<bool>,
}

fn sizing(params: Option<&RawValue>) -> Sizing {
    params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or_default()
}

/// Bytes to reserve from the connection's outbound budget before running `method`: what
/// its reply will take, as far as the params tell (the reply is queued against the same
/// reservation, topped up if it turns out larger).
pub fn reply_reserve(method: &str, params: Option<&RawValue>) -> usize {
    match method {
        "files/read" => base64_len(read_len(params)) as usize + 512,
        "exec/run" => {
            let out = sizing(params)
                .max_output
                .unwrap_or(MAX_EXEC_OUTPUT)
                .min(MAX_EXEC_OUTPUT);
            (2 * base64_len(out) as usize + 1024).min(EXEC_RUN_RESERVE)
        }
        "files/list" if sizing(params).recursive == Some(true) => 1024 * 1024,
        "files/list" | "sandbox/list" | "process/list" | "broker/status" | "provider/list"
        | "provider/info" | "provider/doctor" | "provider/test" | "provider/update" => 64 * 1024,
        _ => SMALL_REPLY,
    }
}

/// The bytes a `files/read` with these params reads at most.
fn read_len(params: Option<&RawValue>) -> u64 {
    sizing(params)
        .length
        .unwrap_or(MAX_READ_LENGTH)
        .min(MAX_READ_LENGTH)
}

/// Bytes `method` holds for a moment while it builds its reply, beyond the reply itself
/// (counted in the broker-wide budget with the reply's reservation, given back once the reply
/// is queued): a `files/read` holds the chunk it read and its encoded copy.
pub fn work_reserve(method: &str, params: Option<&RawValue>) -> usize {
    match method {
        "files/read" => {
            let len = read_len(params);
            (len + base64_len(len)) as usize
        }
        _ => 0,
    }
}

/// The largest reply a plugin may send for `method`: the same bounds as the builtin
/// provider's replies (two streams of [`MAX_EXEC_OUTPUT`] as base64, a chunk of
/// [`MAX_READ_LENGTH`] as base64 or escaped text), [`PLUGIN_REPLY_MAX`] for the rest.
pub fn plugin_reply_bound(method: &str) -> usize {
    match method {
        "exec/run" => 2 * base64_len(MAX_EXEC_OUTPUT) as usize + 1024 * 1024,
        "files/read" => 2 * MAX_READ_LENGTH as usize + 64 * 1024,
        // The plugin's own doctor checks (docs/epp-1.md §6.7): at most 16 shown, each detail
        // cut at 1 KiB; the reply is parsed into a tree, so it is bounded small before that.
        "provider/doctor" => 64 * 1024,
        _ => PLUGIN_REPLY_MAX,
    }
}

/// E1004 unless `length` (of `files/read`) is within [`MAX_READ_LENGTH`].
pub fn check_read_length(length: Option<u64>) -> Result<(), AbxError> {
    match length {
        Some(n) if n > MAX_READ_LENGTH => Err(AbxError::invalid_params(
            "files/read",
            format!("length {n} is above the limit of {MAX_READ_LENGTH} bytes (4 MiB)"),
        )
        .with_suggestion(
            "Read large files in chunks of at most 4 MiB (offset += data length until eof), \
             or copy them out with files/download.",
        )),
        _ => Ok(()),
    }
}

/// E1004 unless `maxOutput` (of `exec/run`) is within [`MAX_EXEC_OUTPUT`].
pub fn check_max_output(max_output: Option<u64>) -> Result<(), AbxError> {
    match max_output {
        Some(n) if n > MAX_EXEC_OUTPUT => Err(AbxError::invalid_params(
            "exec/run",
            format!(
                "maxOutput {n} is above the limit of {MAX_EXEC_OUTPUT} bytes (16 MiB) per stream"
            ),
        )
        .with_suggestion(
            "Stream large output with exec/start (exec/output notifications, no size limit), \
             or redirect it to a file in the sandbox and read that in chunks with files/read.",
        )),
        _ => Ok(()),
    }
}

/// The E1005 answer to a batch of `count` elements (above [`MAX_BATCH`]).
pub fn batch_too_large(count: usize) -> AbxError {
    let mut e = AbxError::new(ErrorCode::MessageTooLarge, &[]);
    e.message = format!(
        "Batch too large: the limit is {MAX_BATCH} requests per batch (this one has {count})."
    );
    e.suggestion = format!(
        "Split it into batches of at most {MAX_BATCH}, or send the requests one by one (they run concurrently)."
    );
    e.with_data("limit", MAX_BATCH).with_data("count", count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn reserves_follow_the_params() {
        assert_eq!(reply_reserve("broker/ping", None), SMALL_REPLY);
        let full = base64_len(MAX_READ_LENGTH) as usize + 512;
        assert_eq!(reply_reserve("files/read", None), full);
        assert_eq!(
            reply_reserve("files/read", Some(&raw(r#"{"length": 3}"#))),
            4 + 512
        );
        // Above the limit it is refused anyway; the reserve never exceeds the bound.
        assert_eq!(
            reply_reserve("files/read", Some(&raw(r#"{"length": 1e12}"#))),
            full
        );
        assert_eq!(
            reply_reserve("exec/run", Some(&raw(r#"{"maxOutput": 30}"#))),
            2 * 40 + 1024
        );
        assert_eq!(reply_reserve("exec/run", None), EXEC_RUN_RESERVE);
        assert!(reply_reserve("files/list", Some(&raw(r#"{"recursive": true}"#))) > 64 * 1024);
    }

    #[test]
    fn bounds_refuse_with_the_chunked_alternative() {
        assert!(check_read_length(Some(MAX_READ_LENGTH)).is_ok());
        let e = check_read_length(Some(MAX_READ_LENGTH + 1)).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidParams);
        assert!(e.message.contains("4194304"), "{}", e.message);
        assert!(e.suggestion.contains("chunks"), "{}", e.suggestion);
        assert!(check_max_output(None).is_ok());
        let e = check_max_output(Some(4_000_000_000)).unwrap_err();
        assert!(e.suggestion.contains("exec/start"), "{}", e.suggestion);
        let e = batch_too_large(500_000);
        assert_eq!(e.code, ErrorCode::MessageTooLarge);
        assert!(e.message.contains("1024") && e.message.contains("500000"));
        assert!(plugin_reply_bound("exec/run") > 2 * MAX_EXEC_OUTPUT as usize);
    }
}
