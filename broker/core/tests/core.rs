//! In-memory tests of the broker core: a test provider injected into `Broker::new`, each
//! connection a `tokio::io::duplex` pipe served by `abx_core::conn::serve`, the client side
//! writing line-framed JSON-RPC with `abx_protocol::message`'s encoders.
//!
//! Integration tests (`tests/`) rather than a `#[cfg(test)]` module: they use only the public
//! surface the daemon composes the broker from (`Broker::new` with injected providers and
//! `Methods`, `conn::serve` over any byte streams, the `Provider` trait), so they also prove
//! that surface is enough; nothing here reaches into private state.
//!
//! The invariant "every request gets exactly one response, a panicking handler included"
//! (lib.rs, conn.rs) is held by the `panic_*` tests (one per path: a spawned request, a
//! batch element, a laned `exec/write`, the inline `broker/status`, the composition root's
//! methods) and by `cancel_*` (a cancelled request is answered -32800 once, by the broker).

mod support;

use abx_core::outbound::OUTBOUND_BUDGET;
use abx_core::provider::{Provider, Registry};
use abx_protocol::{limits, message, ErrorCode, Id};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use support::*;

const MIB: usize = 1024 * 1024;

/// Start `exec/start` on `t:s1` for `exec` (so the broker routes its `exec/write`s).
async fn start_exec(c: &mut Client, exec: &str) {
    let v = c
        .call(
            "exec/start",
            json!({"sandbox": "t:s1", "execId": exec, "command": ["cat"]}),
        )
        .await
        .ok();
    assert_eq!(v["execId"], exec);
}

// ---- cancellation --------------------------------------------------------------------

/// `$/cancelRequest` is answered -32800 at once, although the provider never returns by
/// itself; the provider's token is cancelled and its call dropped; another request in
/// flight on the same connection is untouched and still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_answers_32800_at_once_and_the_provider_sees_its_token_cancelled() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let a = c
        .send(
            "files/read",
            json!({"sandbox": "t:s1", "path": "/a", "do": "hang", "tag": "a"}),
        )
        .await;
    let other = c
        .send(
            "files/read",
            json!({"sandbox": "t:s1", "path": "/b", "gate": "b", "tag": "b"}),
        )
        .await;
    wait_until("both calls to reach the provider", || {
        t.seen.token("a").is_some() && t.seen.token("b").is_some()
    })
    .await;
    c.cancel(&a).await;
    let e = c.reply(&a).await.err_code(ErrorCode::RequestCancelled);
    assert_eq!(e.code, -32800);
    assert!(t.seen.token("a").unwrap().is_cancelled());
    wait_until("the cancelled call to be dropped", || {
        t.seen.dropped.lock().unwrap().contains(&"a".to_owned())
    })
    .await;
    // The other one was not cancelled and answers once let through.
    assert!(!t.seen.token("b").unwrap().is_cancelled());
    t.seen.open("b", 1);
    let v = c.reply(&other).await.ok();
    assert_eq!(v["params"]["path"], "/b");
    // Exactly one reply each: nothing else arrives before the next ping's.
    let p = c.call("broker/ping", json!({})).await.ok();
    assert_eq!(p, json!({}));
    assert!(c.kept().is_empty());
}

/// Cancelling an id that is not running (never sent, already answered, a string id, no id
/// at all) changes nothing: the connection lives and a request in flight keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_an_unknown_id_is_harmless() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let done = c.call("broker/ping", json!({})).await;
    let running = c
        .send(
            "files/read",
            json!({"sandbox": "t:s1", "path": "/r", "gate": "r", "tag": "r"}),
        )
        .await;
    wait_until("the call to reach the provider", || {
        t.seen.token("r").is_some()
    })
    .await;
    c.cancel(&Id::Num(999)).await;
    c.cancel(&done.id.unwrap()).await;
    c.cancel(&Id::Str("nobody".into())).await;
    c.notify("$/cancelRequest", json!({})).await;
    c.notify("$/cancelRequest", json!({"id": {"not": "an id"}}))
        .await;
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
    assert!(!t.seen.token("r").unwrap().is_cancelled());
    t.seen.open("r", 1);
    assert_eq!(c.reply(&running).await.ok()["params"]["path"], "/r");
}

/// A request waiting on its lane (an `exec/write` behind one that is held up) is answered
/// -32800 as soon as it is cancelled, never runs, and the lane goes on with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_write_waiting_on_its_lane_answers_at_once() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    start_exec(&mut c, "e1").await;
    let head = c
        .send(
            "exec/write",
            json!({"execId": "e1", "seq": 0, "gate": "head"}),
        )
        .await;
    let queued = c
        .send("exec/write", json!({"execId": "e1", "seq": 1}))
        .await;
    let last = c
        .send("exec/write", json!({"execId": "e1", "seq": 2}))
        .await;
    wait_until("the head write to hold the lane", || {
        t.seen.writes("e1") == [Step::Enter(0)]
    })
    .await;
    c.cancel(&queued).await;
    let e = c.reply(&queued).await.err_code(ErrorCode::RequestCancelled);
    assert_eq!(e.code, -32800);
    // Answered while the head still holds the lane.
    assert_eq!(t.seen.writes("e1"), [Step::Enter(0)]);
    t.seen.open("head", 1);
    c.reply(&head).await.ok();
    c.reply(&last).await.ok();
    assert_eq!(
        t.seen.writes("e1"),
        [
            Step::Enter(0),
            Step::Leave(0),
            Step::Enter(2),
            Step::Leave(2)
        ]
    );
    assert_eq!(t.seen.count("exec/write"), 2);
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
    assert!(c.kept().is_empty(), "one reply per request");
}

// ---- a panic becomes E9001 ---------------------------------------------------------------

/// A provider call that panics (a spawned request task) is answered E9001 naming the
/// method; the connection and a request in flight beside it carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_in_a_request_is_e9001_and_the_connection_carries_on() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let beside = c
        .send(
            "files/read",
            json!({"sandbox": "t:s1", "path": "/x", "gate": "g", "tag": "g"}),
        )
        .await;
    wait_until("the call beside to start", || t.seen.token("g").is_some()).await;
    let e = c
        .call(
            "files/stat",
            json!({"sandbox": "t:s1", "path": "/p", "do": "panic"}),
        )
        .await
        .err_code(ErrorCode::Internal);
    assert!(e.message.contains("files/stat"), "{e:?}");
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
    assert!(!t.seen.token("g").unwrap().is_cancelled());
    t.seen.open("g", 1);
    assert_eq!(c.reply(&beside).await.ok()["params"]["path"], "/x");
    assert!(c.kept().is_empty(), "one reply per request");
}

/// A handler that panics while it holds its reply's hold (poisoning that lock) is still
/// answered E9001, on the task path and in a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_holding_the_reply_hold_is_still_e9001() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let p = json!({"sandbox": "t:s1", "path": "/p", "do": "panic-holding"});
    c.call("files/stat", p.clone())
        .await
        .err_code(ErrorCode::Internal);
    let (_, one) = c.request("files/stat", p);
    c.write(message::encode_batch(&[one])).await;
    c.batch().await.pop().unwrap().err_code(ErrorCode::Internal);
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
}

/// A batch element that panics is answered E9001 with its own id, inside the one batch
/// reply beside its siblings' results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_in_a_batch_element_is_e9001_beside_the_others() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let (p_id, panics) = c.request(
        "files/stat",
        json!({"sandbox": "t:s1", "path": "/p", "do": "panic"}),
    );
    let (ok_id, ok) = c.request("files/stat", json!({"sandbox": "t:s1", "path": "/ok"}));
    let (ping_id, ping) = c.request("broker/ping", json!({}));
    c.write(message::encode_batch(&[panics, ok, ping])).await;
    let replies = c.batch().await;
    assert_eq!(replies.len(), 3);
    for r in replies {
        match r.id.clone() {
            Some(id) if id == p_id => {
                let e = r.err_code(ErrorCode::Internal);
                assert!(e.message.contains("files/stat"), "{e:?}");
            }
            Some(id) if id == ok_id => assert_eq!(r.ok()["params"]["path"], "/ok"),
            Some(id) if id == ping_id => assert_eq!(r.ok(), json!({})),
            other => panic!("unexpected id {other:?}"),
        }
    }
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
}

/// An `exec/write` that panics on its lane is answered E9001; the lane goes on with the
/// writes queued behind it, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_in_a_laned_write_is_e9001_and_its_lane_goes_on() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    start_exec(&mut c, "e1").await;
    let first = c
        .send("exec/write", json!({"execId": "e1", "seq": 0, "gate": "w"}))
        .await;
    let boom = c
        .send(
            "exec/write",
            json!({"execId": "e1", "seq": 1, "do": "panic"}),
        )
        .await;
    let after = c
        .send("exec/write", json!({"execId": "e1", "seq": 2}))
        .await;
    // Only the first has reached the provider: the others wait on its lane.
    wait_until("the first write to reach the provider", || {
        t.seen.count("exec/write") == 1
    })
    .await;
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
    assert_eq!(t.seen.count("exec/write"), 1, "the lane runs one at a time");
    t.seen.open("w", 1);
    c.reply(&first).await.ok();
    let e = c.reply(&boom).await.err_code(ErrorCode::Internal);
    assert!(e.message.contains("exec/write"), "{e:?}");
    c.reply(&after).await.ok();
    // The panicking one entered after 0 left; 2 still ran after it.
    assert_eq!(
        t.seen.writes("e1"),
        vec![
            Step::Enter(0),
            Step::Leave(0),
            Step::Enter(1),
            Step::Enter(2),
            Step::Leave(2)
        ]
    );
    assert!(c.kept().is_empty(), "one reply per request");
}

/// `broker/status` is answered inline (no task), and asks each provider its `info()`: a
/// provider that panics there gets E9001, not a dead reader; the same through a batch (the
/// task path). The connection carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_on_the_inline_path_is_e9001_and_the_connection_carries_on() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let v = c.call("broker/status", json!({})).await.ok();
    assert_eq!(v["providers"][0]["id"], "t");
    t.seen.panic_in_info.store(true, Ordering::Relaxed);
    let e = c
        .call("broker/status", json!({}))
        .await
        .err_code(ErrorCode::Internal);
    assert!(e.message.contains("broker/status"), "{e:?}");
    let (id, status) = c.request("broker/status", json!({}));
    let (_, ping) = c.request("broker/ping", json!({}));
    c.write(message::encode_batch(&[status, ping])).await;
    let replies = c.batch().await;
    assert_eq!(replies.len(), 2);
    for r in replies {
        if r.id.as_ref() == Some(&id) {
            r.err_code(ErrorCode::Internal);
        } else {
            assert_eq!(r.ok(), json!({}));
        }
    }
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
    t.seen.panic_in_info.store(false, Ordering::Relaxed);
    c.call("broker/status", json!({})).await.ok();
}

/// A composition-root method that panics is E9001 like a provider's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_in_a_composition_root_method_is_e9001() {
    let t = TestProvider::full();
    let (b, _dir) = broker_with(
        vec![t.clone() as Arc<dyn Provider>],
        abx_core::outbound::DEFAULT_POOL,
        Some(Arc::new(RootMethods)),
    );
    let mut c = Client::connect(&b);
    let e = c
        .call("test/panic", json!({}))
        .await
        .err_code(ErrorCode::Internal);
    assert!(e.message.contains("test/panic"), "{e:?}");
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
}

// ---- lifecycle ------------------------------------------------------------------------------

/// `initialize` answers the protocol version and the methods; after `shutdown` every
/// request (the inline ones and provider methods too) is E1010 without reaching the
/// provider; `exit` ends the connection with `ConnEnd::Exit` and the client reads EOF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_initialize_shutdown_e1010_then_exit() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let v = c
        .call(
            "initialize",
            json!({"clientInfo": {"name": "core-test", "version": "1"}}),
        )
        .await
        .ok();
    assert_eq!(v["protocolVersion"], abx_protocol::PROTOCOL_VERSION);
    assert!(v["capabilities"]["methods"]
        .as_array()
        .unwrap()
        .contains(&json!("files/read")));
    c.notify("initialized", json!({})).await;
    assert_eq!(c.call("shutdown", json!({})).await.ok(), Value::Null);
    for (m, p) in [
        ("broker/ping", json!({})),
        ("broker/status", json!({})),
        ("files/read", json!({"sandbox": "t:s1", "path": "/a"})),
    ] {
        let e = c.call(m, p).await.err_code(ErrorCode::ShuttingDown);
        assert!(e.message.contains(m), "{e:?}");
    }
    assert_eq!(t.seen.count("files/read"), 0);
    c.notify("exit", json!(null)).await;
    assert!(c.next().await.is_none(), "EOF after exit");
    assert_eq!(c.ended().await, abx_core::conn::ConnEnd::Exit);
    assert_eq!(b.connections(), 0);
}

/// A client that closes its sending side still gets the replies to what it asked (a
/// request still running when the EOF came included), then `ConnEnd::Eof`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_eof_answers_what_was_asked_then_ends_eof() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let asked = c
        .send(
            "files/read",
            json!({"sandbox": "t:s1", "path": "/late", "gate": "late", "tag": "l"}),
        )
        .await;
    wait_until("the call to reach the provider", || {
        t.seen.token("l").is_some()
    })
    .await;
    c.close_write().await;
    // The broker has read the EOF and is waiting for the request: it stays connected.
    t.seen.open("late", 1);
    assert_eq!(c.reply(&asked).await.ok()["params"]["path"], "/late");
    assert!(!t.seen.token("l").unwrap().is_cancelled());
    assert!(c.next().await.is_none());
    assert_eq!(c.ended().await, abx_core::conn::ConnEnd::Eof);
}

/// A broker stopping ends its connections with `ConnEnd::BrokerShutdown`, cancelling what
/// they were running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_broker_shutdown_ends_connections() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    c.send(
        "files/read",
        json!({"sandbox": "t:s1", "path": "/a", "do": "hang", "tag": "h"}),
    )
    .await;
    wait_until("the call to reach the provider", || {
        t.seen.token("h").is_some()
    })
    .await;
    b.shutdown.cancel();
    assert_eq!(c.ended().await, abx_core::conn::ConnEnd::BrokerShutdown);
    assert!(t.seen.token("h").unwrap().is_cancelled());
}

// ---- backpressure -----------------------------------------------------------------------

/// A client that never reads fills its own outbound budget and no more: its handlers wait
/// (never run), while a second connection on the same broker is answered, large replies
/// included; once it reads, it gets every reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_a_client_that_never_reads_fills_only_its_own_budget() {
    let t = TestProvider::full();
    let (b, _dir) = broker_with(vec![t.clone() as Arc<dyn Provider>], 256 * MIB, None);
    let mut slow = Client::connect(&b);
    const N: usize = 40;
    let mut ids = Vec::new();
    for i in 0..N {
        let p = json!({"sandbox": "t:s1", "path": format!("/big{i}"), "length": MIB, "size": MIB});
        ids.push(slow.send("files/read", p).await);
    }
    // Its queue holds at most OUTBOUND_BUDGET bytes of its replies (~1 MiB each).
    wait_until("the slow client's queue to fill", || {
        t.seen.count("files/read") >= 8
    })
    .await;
    let mut fast = Client::connect(&b);
    assert_eq!(fast.call("broker/ping", json!({})).await.ok(), json!({}));
    let v = fast
        .call(
            "files/read",
            json!({"sandbox": "t:s1", "path": "/fast", "length": MIB, "size": MIB}),
        )
        .await
        .ok();
    assert_eq!(v["data"].as_str().unwrap().len(), MIB);
    let served = t.seen.count("files/read") - 1;
    assert!(
        served * MIB <= OUTBOUND_BUDGET + 2 * MIB,
        "{served} replies of 1 MiB ran for a client that reads nothing"
    );
    assert!(served < N);
    // The pool holds what the slow client's queue holds, never more than its cap.
    let used = b.pool.cap() - b.pool.available();
    assert!(
        used <= OUTBOUND_BUDGET + 8 * MIB,
        "{used} bytes of the pool in use"
    );
    for id in &ids {
        let v = slow.reply(id).await.ok();
        assert_eq!(v["data"].as_str().unwrap().len(), MIB);
    }
    assert_eq!(t.seen.count("files/read"), N + 1);
    wait_until("the pool to be free again", || {
        b.pool.available() == b.pool.cap()
    })
    .await;
}

/// With a broker-wide pool smaller than one connection's budget, a client that never reads
/// holds at most the pool: its handlers wait for it, another connection's small replies
/// still pass (their own allowance) while its large one waits for the pool, and everything
/// is answered once the first client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_the_broker_wide_pool_is_never_exceeded() {
    let t = TestProvider::full();
    let pool = 12 * MIB;
    let (b, _dir) = broker_with(vec![t.clone() as Arc<dyn Provider>], pool, None);
    assert_eq!(b.pool.cap(), pool);
    let mut slow = Client::connect(&b);
    const N: usize = 30;
    let mut ids = Vec::new();
    for i in 0..N {
        let p = json!({"sandbox": "t:s1", "path": format!("/big{i}"), "length": MIB, "size": MIB});
        ids.push(slow.send("files/read", p).await);
    }
    wait_until("the slow client to take the pool", || {
        t.seen.count("files/read") >= 4
    })
    .await;
    let mut fast = Client::connect(&b);
    assert_eq!(fast.call("broker/ping", json!({})).await.ok(), json!({}));
    let small = fast
        .call("files/stat", json!({"sandbox": "t:s1", "path": "/small"}))
        .await
        .ok();
    assert_eq!(small["params"]["path"], "/small");
    let served = t.seen.count("files/read");
    assert!(
        served * MIB <= pool,
        "{served} replies of 1 MiB ran with a pool of {pool} bytes"
    );
    let big = fast
        .send(
            "files/read",
            json!({"sandbox": "t:s1", "path": "/fast", "length": MIB, "size": MIB}),
        )
        .await;
    for id in &ids {
        assert_eq!(
            slow.reply(id).await.ok()["data"].as_str().unwrap().len(),
            MIB
        );
    }
    assert_eq!(
        fast.reply(&big).await.ok()["data"].as_str().unwrap().len(),
        MIB
    );
    wait_until("the pool to be free again", || {
        b.pool.available() == b.pool.cap()
    })
    .await;
}

// ---- batches ----------------------------------------------------------------------------------

/// A batch of requests, notifications and invalid elements is answered in one batch reply:
/// one element per request (invalid ones included, with their ids), none for the
/// notifications; per-element errors keep their ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mixed_is_one_reply_without_the_notifications() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let (ping_id, ping) = c.request("broker/ping", json!({}));
    let (read_id, read) = c.request("files/read", json!({"sandbox": "t:s1", "path": "/r"}));
    let (unknown_id, unknown) = c.request("no/such", json!({}));
    let (fail_id, fail) = c.request("files/stat", json!({"sandbox": "t:s1", "do": "fail"}));
    let note = message::encode_notification("initialized", Some(&json!({})));
    let cancel = message::encode_notification("$/cancelRequest", Some(&json!({"id": 12345})));
    let bad_version = br#"{"jsonrpc":"1.0","id":"v1","method":"broker/ping"}"#.to_vec();
    let not_object = b"7".to_vec();
    c.write(message::encode_batch(&[
        ping,
        note,
        read,
        cancel,
        unknown,
        bad_version,
        not_object,
        fail,
    ]))
    .await;
    let replies = c.batch().await;
    assert_eq!(replies.len(), 6, "{replies:?}");
    for r in replies {
        match r.id.clone() {
            Some(id) if id == ping_id => assert_eq!(r.ok(), json!({})),
            Some(id) if id == read_id => assert_eq!(r.ok()["params"]["path"], "/r"),
            Some(id) if id == unknown_id => {
                assert_eq!(r.err_code(ErrorCode::MethodNotFound).code, -32601);
            }
            Some(id) if id == fail_id => {
                r.err_code(ErrorCode::SandboxNotFound);
            }
            Some(Id::Str(s)) if s == "v1" => {
                r.err_code(ErrorCode::InvalidRequest);
            }
            None => {
                r.err_code(ErrorCode::InvalidRequest);
            }
            other => panic!("unexpected id {other:?}"),
        }
    }
    // A batch of notifications only gets no reply at all: the next frame is the ping's.
    let n1 = message::encode_notification("initialized", Some(&json!({})));
    let n2 = message::encode_notification("$/cancelRequest", Some(&json!({"id": 1})));
    c.write(message::encode_batch(&[n1, n2])).await;
    let id = c.send("broker/ping", json!({})).await;
    match c.next().await {
        Some(Got::Reply(r)) => assert_eq!(r.id, Some(id)),
        other => panic!("expected the ping's reply, got {other:?}"),
    }
}

/// An empty batch is one Invalid Request (not an array), id null.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_empty_is_one_invalid_request() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    c.write(b"[]".to_vec()).await;
    match c.next().await {
        Some(Got::Reply(r)) => {
            assert_eq!(r.id, None);
            r.err_code(ErrorCode::InvalidRequest);
        }
        other => panic!("expected one error, got {other:?}"),
    }
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
}

/// More than `limits::MAX_BATCH` elements: one E1005 (id null), nothing of it runs, the
/// connection lives; exactly `MAX_BATCH` is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_above_max_batch_is_e1005_and_none_of_it_runs() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let stat = |c: &mut Client| {
        c.request("files/stat", json!({"sandbox": "t:s1", "path": "/s"}))
            .1
    };
    let over: Vec<Vec<u8>> = (0..=limits::MAX_BATCH).map(|_| stat(&mut c)).collect();
    c.write(message::encode_batch(&over)).await;
    match c.next().await {
        Some(Got::Reply(r)) => {
            assert_eq!(r.id, None);
            let e = r.err_code(ErrorCode::MessageTooLarge);
            assert_eq!(e.data.unwrap()["count"], limits::MAX_BATCH + 1);
        }
        other => panic!("expected one E1005, got {other:?}"),
    }
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
    assert_eq!(t.seen.count("files/stat"), 0);
    let full: Vec<Vec<u8>> = (0..limits::MAX_BATCH).map(|_| stat(&mut c)).collect();
    c.write(message::encode_batch(&full)).await;
    let replies = c.batch().await;
    assert_eq!(replies.len(), limits::MAX_BATCH);
    assert!(replies.into_iter().all(|r| r.outcome.is_ok()));
    assert_eq!(t.seen.count("files/stat"), limits::MAX_BATCH);
}

// ---- lanes ------------------------------------------------------------------------------------

/// `exec/write`s of one execId apply in arrival order, one at a time, though each takes a
/// different time; a write of another execId runs meanwhile (answered while the first
/// exec's lane is held up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_keep_one_execs_writes_in_order_and_run_execs_concurrently() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    start_exec(&mut c, "e1").await;
    start_exec(&mut c, "e2").await;
    const N: u64 = 40;
    let mut ids = vec![
        c.send(
            "exec/write",
            json!({"execId": "e1", "seq": 0, "gate": "hold"}),
        )
        .await,
    ];
    wait_until("the first write to hold its lane", || {
        t.seen.writes("e1") == [Step::Enter(0)]
    })
    .await;
    for seq in 1..N {
        let spin = (N - seq) % 7 * 5;
        ids.push(
            c.send(
                "exec/write",
                json!({"execId": "e1", "seq": seq, "spin": spin}),
            )
            .await,
        );
    }
    // e2's writes pass e1's held lane; by their replies the broker has read (and queued)
    // every e1 write sent before them, and none of those has started.
    for seq in 0..3 {
        c.call("exec/write", json!({"execId": "e2", "seq": seq, "spin": 3}))
            .await
            .ok();
    }
    assert_eq!(t.seen.writes("e1"), vec![Step::Enter(0)]);
    assert_eq!(t.seen.writes("e2").len(), 6);
    t.seen.open("hold", 1);
    for id in &ids {
        c.reply(id).await.ok();
    }
    let want: Vec<Step> = (0..N)
        .flat_map(|s| [Step::Enter(s), Step::Leave(s)])
        .collect();
    assert_eq!(t.seen.writes("e1"), want);
}

/// Writes of different execs overlap in the provider (each waits for the other's gate),
/// which one lane for everything would deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_of_different_execs_overlap() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    start_exec(&mut c, "a").await;
    start_exec(&mut c, "b").await;
    let a = c
        .send(
            "exec/write",
            json!({"execId": "a", "seq": 0, "gate": "a", "tag": "a"}),
        )
        .await;
    let bb = c
        .send(
            "exec/write",
            json!({"execId": "b", "seq": 0, "gate": "b", "tag": "b"}),
        )
        .await;
    wait_until("both writes to be in the provider at once", || {
        t.seen.token("a").is_some() && t.seen.token("b").is_some()
    })
    .await;
    t.seen.open("b", 1);
    c.reply(&bb).await.ok();
    t.seen.open("a", 1);
    c.reply(&a).await.ok();
}

/// A stream's notifications (sent by the provider through its `Outbound`) follow its
/// reply, all of them, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_notifications_follow_their_reply_in_order() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let id = c
        .send(
            "exec/start",
            json!({"sandbox": "t:s1", "execId": "st", "stream": 100}),
        )
        .await;
    match c.next().await {
        Some(Got::Reply(r)) => {
            assert_eq!(r.id.as_ref(), Some(&id));
            assert_eq!(r.ok()["execId"], "st");
        }
        other => panic!("expected the reply first, got {other:?}"),
    }
    for i in 0..100 {
        match c.next().await {
            Some(Got::Note(m, p)) => {
                assert_eq!(m, "exec/output");
                assert_eq!(p["data"], i.to_string());
            }
            other => panic!("expected notification {i}, got {other:?}"),
        }
    }
}

/// Small replies are written by their senders when nothing is queued or being written
/// (outbound::Writer), the rest by the connection's write task. Through pipes of a few
/// bytes (nearly every write is partial, the two take turns), a few hundred and 64 KiB,
/// every frame still arrives whole, every request is answered once, and each stream's notifications come
/// after its reply and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_written_by_their_senders_and_queued_messages_never_interleave() {
    for pipe in [23, 300, PIPE] {
        for pipelined in [false, true] {
            interleave_through(pipe, pipelined).await;
        }
    }
}

/// `pipelined`: the 60 requests in one write (the reader serves them as a burst, gathering
/// its replies, while the streams' notifications are queued beside them).
async fn interleave_through(pipe: usize, pipelined: bool) {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect_pipe(&b, pipe);
    let mut asked = std::collections::HashMap::new();
    let mut burst = Vec::new();
    for i in 0..60 {
        let (id, body) = if i % 3 == 0 {
            c.request(
                "exec/start",
                json!({"sandbox": "t:s1", "execId": format!("x{i}"), "stream": 15}),
            )
        } else if i % 3 == 1 {
            c.request("sandbox/list", json!({"provider": "t"}))
        } else {
            c.request("broker/ping", json!({}))
        };
        if pipelined {
            burst.extend(body);
            burst.push(b'\n');
        } else {
            c.write(body).await;
        }
        asked.insert(id, i);
    }
    if pipelined {
        c.write_raw(&burst).await;
    }
    let (mut replies, mut notes) = (0, 0);
    let mut next_note: std::collections::HashMap<String, u64> = Default::default();
    while replies < 60 || notes < 20 * 15 {
        match c.next().await {
            Some(Got::Reply(r)) => {
                let id = r.id.clone().expect("an id");
                let i = asked
                    .remove(&id)
                    .unwrap_or_else(|| panic!("{id} answered twice"));
                let v = r.ok();
                if i % 3 == 0 {
                    assert_eq!(v["execId"], format!("x{i}"));
                    assert!(next_note.insert(format!("x{i}"), 0).is_none());
                } else if i % 3 == 1 {
                    assert!(v["sandboxes"].is_array(), "{v}");
                } else {
                    assert_eq!(v, json!({}));
                }
                replies += 1;
            }
            Some(Got::Note(m, p)) => {
                assert_eq!(m, "exec/output");
                let exec = p["execId"].as_str().unwrap().to_owned();
                let n = next_note
                    .get_mut(&exec)
                    .unwrap_or_else(|| panic!("a note of {exec} before its reply"));
                assert_eq!(p["data"], n.to_string(), "{exec}'s notes in order");
                *n += 1;
                notes += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(asked.is_empty());
    assert!(next_note.values().all(|n| *n == 15));
}

/// `n` `broker/ping` requests (ids 0 to n-1), one line each, for one write.
fn ping_burst(n: usize) -> Vec<u8> {
    let mut burst = Vec::new();
    for i in 0..n {
        burst.extend(message::encode_request::<Value>(
            &Id::Num(i as i64),
            "broker/ping",
            None,
        ));
        burst.push(b'\n');
    }
    burst
}

/// The next line the broker wrote, as JSON.
async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(lines: &mut tokio::io::Lines<R>) -> Value {
    let line = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("a reply in time")
        .expect("read from the broker")
        .expect("a line");
    serde_json::from_str(&line).expect("JSON")
}

type Duplex = tokio::io::DuplexStream;
type ClientLines = tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<Duplex>>>;

/// A connection served over an in-memory pipe whose broker side writes through `wrap`: the
/// serving task, and the client's replies as lines and its write half.
fn serve_piped<W>(
    b: &Arc<abx_core::broker::Broker>,
    wrap: impl FnOnce(tokio::io::WriteHalf<Duplex>) -> W,
) -> (
    tokio::task::JoinHandle<abx_core::conn::ConnEnd>,
    ClientLines,
    tokio::io::WriteHalf<Duplex>,
)
where
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::AsyncBufReadExt;
    let (client, server) = tokio::io::duplex(PIPE);
    let (sr, sw) = tokio::io::split(server);
    let served = tokio::spawn(abx_core::conn::serve(b.clone(), sr, wrap(sw)));
    let (cr, cw) = tokio::io::split(client);
    (served, tokio::io::BufReader::new(cr).lines(), cw)
}

/// The client of [`serve_piped`] closes its side; the connection ends.
async fn hang_up(
    served: tokio::task::JoinHandle<abx_core::conn::ConnEnd>,
    lines: ClientLines,
    mut cw: tokio::io::WriteHalf<Duplex>,
) {
    use tokio::io::AsyncWriteExt;
    cw.shutdown().await.unwrap();
    drop(lines);
    let _ = served.await;
}

/// A client that pipelines (a burst of requests in one write) gets the burst's replies in a
/// few writes, not one system call per reply: while more of its bytes are already read, the
/// reader gathers what it answers in the connection's writer and writes it all at the
/// burst's end. Without that, 100 pings cost 101 writes and the daemon's pipelined
/// throughput fell to a quarter (docs/performance.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_burst_is_answered_in_a_few_writes() {
    struct Counting<W> {
        inner: W,
        writes: Arc<std::sync::atomic::AtomicUsize>,
    }
    impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counting<W> {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.writes.fetch_add(1, Ordering::Relaxed);
            std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }
    use tokio::io::AsyncWriteExt;
    const BURST: usize = 100;
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (served, mut lines, mut cw) = serve_piped(&b, |sw| Counting {
        inner: sw,
        writes: writes.clone(),
    });
    let burst = ping_burst(BURST);
    assert!(burst.len() < 8 * 1024, "one read takes the whole burst");
    cw.write_all(&burst).await.unwrap();
    let mut seen = std::collections::HashSet::new();
    while seen.len() < BURST {
        let v = next_line(&mut lines).await;
        assert!(v["result"].is_object(), "{v}");
        assert!(seen.insert(v["id"].as_i64().unwrap()), "{v} answered twice");
    }
    let n = writes.load(Ordering::Relaxed);
    assert!(
        n <= BURST / 10,
        "{BURST} pipelined pings were answered in {n} writes"
    );
    hang_up(served, lines, cw).await;
}

/// A burst whose last request is cut short (the rest of it not sent yet) is answered up to
/// the cut: the reader lets the burst's replies go before it waits for more bytes, so a
/// client that waits for them before finishing its request is not stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_cut_short_is_answered_up_to_the_cut() {
    let t = TestProvider::full();
    let (b, _dir) = broker(&t);
    let mut c = Client::connect(&b);
    let mut burst = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (id, body) = c.request("broker/ping", json!({}));
        burst.extend(body);
        burst.push(b'\n');
        ids.push(id);
    }
    let (last, body) = c.request("broker/ping", json!({}));
    let cut = body.len() / 2;
    burst.extend(&body[..cut]);
    c.write_raw(&burst).await;
    // The five whole requests are answered while the sixth is still cut: `{}` each.
    for id in &ids {
        let r = c.reply(id).await;
        assert_eq!(r.outcome.unwrap(), json!({}), "{id}");
    }
    let mut rest = body[cut..].to_vec();
    rest.push(b'\n');
    c.write_raw(&rest).await;
    let r = c.reply(&last).await;
    assert_eq!(r.outcome.unwrap(), json!({}));
}

/// A client that pipelines more pings than the broker's memory holds replies for, reading
/// nothing until it has written them all, still gets every reply: when a reply must wait for
/// room mid-burst, the reader lets the burst's replies go first (it never waits on the write
/// task while holding it back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_the_budget_is_answered_whole() {
    use tokio::io::AsyncWriteExt;
    const N: usize = 30_000;
    let t = TestProvider::full();
    let (b, _dir) = broker_with(vec![t.clone() as Arc<dyn Provider>], MIB, None);
    let (served, mut lines, mut cw) = serve_piped(&b, |sw| sw);
    let writing = tokio::spawn(async move {
        cw.write_all(&ping_burst(N)).await.unwrap();
        cw
    });
    // Only once the broker has stopped reading (its budget full) does the client read.
    wait_until("the broker's memory to fill", || {
        b.pool.available() < MIB / 8
    })
    .await;
    for i in 0..N {
        let v = next_line(&mut lines).await;
        assert_eq!(v["id"], i, "{v}");
    }
    hang_up(served, lines, writing.await.unwrap()).await;
}

// ---- the method table, routing and gating ---------------------------------------------

/// The composition root's `Methods` are reached after the core's own (its `broker/ping`
/// never is); an unknown method is -32601 (E1003) with or without a root table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_of_the_composition_root_come_after_the_cores_own() {
    let t = TestProvider::full();
    let (b, _dir) = broker_with(
        vec![t.clone() as Arc<dyn Provider>],
        abx_core::outbound::DEFAULT_POOL,
        Some(Arc::new(RootMethods)),
    );
    let mut c = Client::connect(&b);
    // `initialize` lists the root's methods beside the core's (clients check for them).
    let init = c.call("initialize", json!({})).await.ok();
    let listed = init["capabilities"]["methods"].as_array().unwrap().clone();
    for m in ["test/echo", "test/panic", "broker/ping", "sandbox/create"] {
        assert!(listed.contains(&json!(m)), "{m} not in {listed:?}");
    }
    let v = c.call("test/echo", json!({"x": 1})).await.ok();
    assert_eq!(v, json!({"from": "root", "params": {"x": 1}}));
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
    let (id, ping) = c.request("broker/ping", json!({}));
    c.write(message::encode_batch(&[ping])).await;
    let r = c.batch().await.pop().unwrap();
    assert_eq!(r.id, Some(id));
    assert_eq!(r.ok(), json!({}), "the task path too");
    let e = c
        .call("no/such", json!({}))
        .await
        .err_code(ErrorCode::MethodNotFound);
    assert_eq!(e.code, -32601);

    let (bare, _dir2) = broker(&t);
    let mut c = Client::connect(&bare);
    let e = c
        .call("test/echo", json!({}))
        .await
        .err_code(ErrorCode::MethodNotFound);
    assert!(e.message.contains("test/echo"));
}

/// A method whose feature the provider does not declare is E8004 before the provider is
/// called (by `provider:id`, by a bare id it owns, and by `provider`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gating_a_missing_feature_is_e8004_before_the_provider_is_called() {
    let t = TestProvider::full();
    let u = TestProvider::new("u", &["sandbox.lifecycle"], &["u1"]);
    let (b, _dir) = broker_with(
        vec![
            t.clone() as Arc<dyn Provider>,
            u.clone() as Arc<dyn Provider>,
        ],
        abx_core::outbound::DEFAULT_POOL,
        None,
    );
    let mut c = Client::connect(&b);
    for p in [
        json!({"sandbox": "u:u1", "path": "/a"}),
        json!({"sandbox": "u1", "path": "/a"}),
    ] {
        let e = c
            .call("files/read", p)
            .await
            .err_code(ErrorCode::FeatureNotSupported);
        assert!(
            e.message.contains('u') && e.message.contains("files.rw"),
            "{e:?}"
        );
    }
    let e = c
        .call("exec/start", json!({"provider": "u", "command": ["true"]}))
        .await
        .err_code(ErrorCode::FeatureNotSupported);
    assert!(e.message.contains("exec.stream"), "{e:?}");
    // A pty needs the `pty` feature, which `t` lacks.
    c.call(
        "exec/start",
        json!({"sandbox": "t:s1", "pty": {"rows": 2, "cols": 2}}),
    )
    .await
    .err_code(ErrorCode::FeatureNotSupported);
    assert!(u.seen.calls.lock().unwrap().is_empty());
    assert_eq!(t.seen.count("exec/start"), 0);
    // What it declares reaches it.
    c.call("sandbox/info", json!({"sandbox": "u1"})).await.ok();
    assert_eq!(u.seen.count("sandbox/info"), 1);
}

/// `provider:id` and bare ids reach their provider with `sandbox` rewritten to the
/// provider's own id: a bare id by the provider that owns it, by the index (a sandbox the
/// broker saw created), or by asking the providers; an id nobody holds is E2009; an
/// unknown provider is E8001.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_resolves_prefixed_and_bare_sandbox_ids() {
    let t = TestProvider::full();
    let u = TestProvider::new("u", &["sandbox.lifecycle", "files.rw"], &["u1"]);
    let (b, _dir) = broker_with(
        vec![
            t.clone() as Arc<dyn Provider>,
            u.clone() as Arc<dyn Provider>,
        ],
        abx_core::outbound::DEFAULT_POOL,
        None,
    );
    let mut c = Client::connect(&b);
    let v = c
        .call("files/stat", json!({"sandbox": "u:u1", "path": "/"}))
        .await
        .ok();
    assert_eq!(
        (v["provider"].clone(), v["params"]["sandbox"].clone()),
        (json!("u"), json!("u1"))
    );
    let v = c
        .call("files/stat", json!({"sandbox": "s1", "path": "/"}))
        .await
        .ok();
    assert_eq!(
        (v["provider"].clone(), v["params"]["sandbox"].clone()),
        (json!("t"), json!("s1"))
    );
    // Created through the broker on `u` (not the default): found by the index afterwards.
    let v = c
        .call("sandbox/create", json!({"provider": "u", "id": "made"}))
        .await
        .ok();
    assert_eq!(v["id"], "made");
    assert!(!u
        .seen
        .calls
        .lock()
        .unwrap()
        .last()
        .unwrap()
        .1
        .as_object()
        .unwrap()
        .contains_key("provider"));
    let v = c
        .call("files/stat", json!({"sandbox": "made", "path": "/"}))
        .await
        .ok();
    assert_eq!(v["provider"], "u");
    // Nobody holds it: each provider is asked (sandbox/info), then E2009.
    c.call("files/stat", json!({"sandbox": "zz", "path": "/"}))
        .await
        .err_code(ErrorCode::SandboxNotFound);
    assert!(t
        .seen
        .calls
        .lock()
        .unwrap()
        .iter()
        .any(|(m, p)| m == "sandbox/info" && p["sandbox"] == "zz"));
    c.call("files/stat", json!({"sandbox": "nope:x", "path": "/"}))
        .await
        .err_code(ErrorCode::SandboxNotFound);
    c.call("files/stat", json!({"provider": "nope", "path": "/"}))
        .await
        .err_code(ErrorCode::ProviderNotInstalled);
    // No sandbox, no provider: the default (the first).
    let v = c.call("files/stat", json!({"path": "/"})).await.ok();
    assert_eq!(v["provider"], "t");
}

// ---- the registry -------------------------------------------------------------------------

fn reg() -> (Registry, Arc<TestProvider>, Arc<TestProvider>) {
    let t = TestProvider::full();
    let u = TestProvider::new("u", &["sandbox.lifecycle"], &["u1"]);
    let r = Registry::new(vec![
        t.clone() as Arc<dyn Provider>,
        u.clone() as Arc<dyn Provider>,
    ]);
    (r, t, u)
}

fn ids(r: &Registry) -> Vec<String> {
    r.all().iter().map(|p| p.summary().id.clone()).collect()
}

#[test]
fn registry_default_is_the_first_provider_and_set_default_changes_it() {
    let (r, _, _) = reg();
    assert_eq!(r.default_id(), "t");
    r.set_default("u").unwrap();
    assert_eq!(r.default_id(), "u");
    assert_eq!(Registry::new(vec![]).default_id(), "");
}

#[test]
fn registry_set_default_of_an_unknown_id_is_e8001_and_keeps_the_default() {
    let (r, _, _) = reg();
    let e = r.set_default("ghost").unwrap_err();
    assert_eq!(e.code, ErrorCode::ProviderNotInstalled);
    assert!(e.message.contains("ghost"));
    assert_eq!(r.default_id(), "t");
    assert_eq!(
        r.get("ghost").err().unwrap().code,
        ErrorCode::ProviderNotInstalled
    );
}

#[test]
fn registry_upsert_replaces_by_id_and_remove_forgets() {
    let (r, _, _) = reg();
    let t2 = TestProvider::new("t", &["files.rw"], &[]);
    r.upsert(t2.clone());
    assert_eq!(ids(&r), ["u", "t"]);
    assert_eq!(r.get("t").unwrap().summary().features, ["files.rw"]);
    assert_eq!(
        ids(&Registry::new(r.with_feature("sandbox.lifecycle"))),
        ["u"]
    );
    r.upsert(TestProvider::new("v", &[], &[]));
    assert_eq!(ids(&r), ["u", "t", "v"]);
    r.remove("u");
    r.remove("never-there");
    assert_eq!(ids(&r), ["t", "v"]);
    assert!(r.get("u").is_err());
}

#[test]
fn registry_owner_of_asks_each_provider() {
    let (r, _, _) = reg();
    assert_eq!(r.owner_of("s1").unwrap().summary().id, "t");
    assert_eq!(r.owner_of("u1").unwrap().summary().id, "u");
    assert!(r.owner_of("zz").is_none());
    r.remove("u");
    assert!(r.owner_of("u1").is_none());
}

/// A provider that takes its params raw (as a plugin does) and answers with what it got.
struct RawProbe {
    summary: abx_core::provider::ProviderSummary,
    got: std::sync::Mutex<Vec<String>>,
}

impl Provider for RawProbe {
    fn summary(&self) -> &abx_core::provider::ProviderSummary {
        &self.summary
    }
    fn owns(&self, sandbox: &str) -> bool {
        sandbox == "sb-1"
    }
    fn takes_raw(&self) -> bool {
        true
    }
    fn call<'a>(
        &'a self,
        _cx: &'a abx_core::provider::CallCx,
        _method: &'a str,
        _params: Value,
    ) -> abx_core::provider::BoxFut<'a, abx_core::provider::Reply> {
        Box::pin(async { panic!("a raw provider is called raw") })
    }
    fn call_raw<'a>(
        &'a self,
        _cx: &'a abx_core::provider::CallCx,
        _method: &'a str,
        params: Box<serde_json::value::RawValue>,
    ) -> abx_core::provider::BoxFut<'a, abx_core::provider::Reply> {
        Box::pin(async move {
            self.got.lock().unwrap().push(params.get().to_owned());
            Ok(serde_json::value::to_raw_value(&json!({"ok": true})).unwrap())
        })
    }
}

/// Issue 25: a provider that takes raw params gets every member as the client wrote it,
/// byte for byte (number spellings, escapes, spacing inside members), with only `sandbox`
/// rewritten to its own id and `provider` removed; a provider that reads params gets them
/// parsed (the test provider above, everywhere else in this file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_params_reach_a_raw_provider_as_written_but_for_the_sandbox() {
    let probe = Arc::new(RawProbe {
        summary: abx_core::provider::ProviderSummary {
            id: "raw".into(),
            name: "raw probe".into(),
            version: "0".into(),
            kind: abx_core::provider::Kind::Exec,
            trust: "local".into(),
            features: vec!["exec.stream".into(), "sandbox.lifecycle".into()],
            description: String::new(),
        },
        got: Default::default(),
    });
    let (b, _dir) = broker_with(
        vec![probe.clone() as Arc<dyn Provider>],
        abx_core::outbound::DEFAULT_POOL,
        None,
    );
    let mut c = Client::connect(&b);
    let body = br#"{"jsonrpc":"2.0","id":7,"method":"exec/start","params":{"sandbox":"raw:sb-1","provider":"raw","command":[ "echo" , "caf\u00e9" ],"env":{"N":"1.50e2"},"timeout":1.50e2}}"#;
    c.write(body.to_vec()).await;
    let r = c.reply(&Id::Num(7)).await;
    assert_eq!(r.ok(), json!({"ok": true}));
    let got = probe.got.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![r#"{"command":[ "echo" , "caf\u00e9" ],"env":{"N":"1.50e2"},"timeout":1.50e2,"sandbox":"sb-1"}"#.to_owned()],
    );
}

// ---- params members (issue 41) ----------------------------------------------------------

/// A provider of every feature, `p`, owning `s1`; and a broker over it.
fn all_features() -> (Arc<TestProvider>, Arc<abx_core::Broker>, tempfile::TempDir) {
    let t = TestProvider::new("p", abx_protocol::features::ALL, &["s1"]);
    let (b, dir) = broker(&t);
    (t, b, dir)
}

/// Every method whose params are closed refuses a member its params type does not name:
/// E1004 naming the member and the method (the table is iterated, so a method added later is
/// covered), and no provider is called: the check comes before routing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_closed_method_refuses_a_made_up_member_before_any_provider() {
    let (t, b, _dir) = all_features();
    let mut c = Client::connect(&b);
    let served = |m: &str| {
        abx_core::dispatch::METHODS.contains(&m)
            || abx_protocol::features::PROVIDER_METHODS.contains(&m)
    };
    let mut checked = 0;
    for e in abx_protocol::api::params::params_table() {
        if e.open || !served(e.method) {
            continue;
        }
        let m = e.method;
        let err = c
            .call(m, json!({"zzMadeUp": [1, {"deep": true}]}))
            .await
            .err_code(ErrorCode::InvalidParams);
        assert_eq!(
            err.message,
            format!("Invalid params for '{m}': unknown member 'zzMadeUp'"),
        );
        let data = err.data.clone().unwrap();
        assert_eq!(data["unknown"], json!(["zzMadeUp"]), "{m}");
        let suggestion = data["suggestion"].as_str().unwrap();
        assert!(suggestion.contains("upgrade abx"), "{m}: {suggestion}");
        // With what the method does take beside it: still refused, the others not named.
        let mut p = serde_json::Map::new();
        for f in e.fields() {
            p.insert((*f).to_owned(), json!("x"));
        }
        p.insert("zzMadeUp".into(), json!(1));
        let err = c
            .call(m, Value::Object(p))
            .await
            .err_code(ErrorCode::InvalidParams);
        assert!(
            err.message.ends_with("unknown member 'zzMadeUp'"),
            "{m}: {err:?}"
        );
        checked += 1;
    }
    assert!(checked > 40, "only {checked} methods checked");
    assert_eq!(
        t.seen.calls.lock().unwrap().clone(),
        vec![],
        "no provider call"
    );
    // The connection carries on.
    assert_eq!(c.call("broker/ping", json!({})).await.ok(), json!({}));
}

/// `sandbox/create {volumes: [...]}` (a member of some newer API) is refused, naming it: no
/// sandbox is made without what the client asked for. The same create without it works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_create_with_an_unknown_member_creates_nothing() {
    let (t, b, _dir) = all_features();
    let mut c = Client::connect(&b);
    let err = c
        .call(
            "sandbox/create",
            json!({"provider": "p", "id": "new1", "template": "base",
                   "volumes": [{"source": "/data", "target": "/workspace/data"}]}),
        )
        .await
        .err_code(ErrorCode::InvalidParams);
    assert_eq!(
        err.message,
        "Invalid params for 'sandbox/create': unknown member 'volumes'"
    );
    let data = err.data.unwrap();
    assert_eq!(
        data["accepted"],
        json!([
            "provider", "template", "timeout", "env", "metadata", "network", "limits", "mounts"
        ])
    );
    assert!(
        data["suggestion"]
            .as_str()
            .unwrap()
            .starts_with("'sandbox/create' takes 'provider', 'template', 'timeout'"),
        "{data}"
    );
    assert_eq!(t.seen.count("sandbox/create"), 0);
    assert!(b.index.get("new1").is_none());
    // Two unknown members are named, in the order they came (`json!` sorts them).
    let err = c
        .call(
            "sandbox/create",
            json!({"provider": "p", "volumes": [], "gpu": 1}),
        )
        .await
        .err_code(ErrorCode::InvalidParams);
    assert_eq!(
        err.message,
        "Invalid params for 'sandbox/create': unknown members 'gpu', 'volumes'"
    );
    assert_eq!(t.seen.count("sandbox/create"), 0);
    let v = c
        .call(
            "sandbox/create",
            json!({"provider": "p", "id": "new1", "template": "base"}),
        )
        .await
        .ok();
    assert_eq!(v["id"], "new1");
    assert_eq!(b.index.get("new1").as_deref(), Some("p"));
}

/// A provider that takes its params raw (as plugins do: they get them as the client wrote
/// them) never sees a member the method does not take, whether the sandbox or `provider`
/// routes the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_provider_never_sees_an_unknown_member() {
    let probe = Arc::new(RawProbe {
        summary: abx_core::provider::ProviderSummary {
            id: "raw".into(),
            name: "raw probe".into(),
            version: "0".into(),
            kind: abx_core::provider::Kind::Exec,
            trust: "local".into(),
            features: vec!["exec.stream".into(), "sandbox.lifecycle".into()],
            description: String::new(),
        },
        got: Default::default(),
    });
    let (b, _dir) = broker_with(
        vec![probe.clone() as Arc<dyn Provider>],
        abx_core::outbound::DEFAULT_POOL,
        None,
    );
    let mut c = Client::connect(&b);
    for p in [
        json!({"sandbox": "raw:sb-1", "command": "true", "mounts": ["/x"]}),
        json!({"provider": "raw", "command": "true", "mounts": ["/x"]}),
        json!({"sandbox": "sb-1", "command": "true", "privileged": true}),
    ] {
        c.call("exec/start", p)
            .await
            .err_code(ErrorCode::InvalidParams);
    }
    c.call("sandbox/create", json!({"provider": "raw", "volumes": []}))
        .await
        .err_code(ErrorCode::InvalidParams);
    assert_eq!(probe.got.lock().unwrap().clone(), Vec::<String>::new());
    // What the method takes (and `provider`, which routes it) still reaches it.
    let v = c
        .call(
            "exec/start",
            json!({"sandbox": "sb-1", "provider": "raw", "command": "true", "cwd": "/w"}),
        )
        .await
        .ok();
    assert_eq!(v, json!({"ok": true}));
    assert_eq!(probe.got.lock().unwrap().len(), 1);
}

/// Only member names are read: a large `files/write` goes through (its data is not parsed
/// twice into anything), and the same write with an unknown member is refused before the
/// provider gets its 48 MiB. Open params (LSP's `initialize`, provider-defined `templates/*`)
/// take any member, and it reaches the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_only_are_checked_and_open_params_take_any_member() {
    let (t, b, _dir) = all_features();
    let mut c = Client::connect(&b);
    let data = "QUJD".repeat(12 * MIB);
    let v = c
        .call(
            "files/write",
            json!({"sandbox": "p:s1", "path": "/big", "data": data, "encoding": "base64", "size": 1}),
        )
        .await
        .ok();
    assert_eq!(v["data"], "x");
    assert_eq!(t.seen.count("files/write"), 1);
    let e = c
        .call(
            "files/write",
            json!({"sandbox": "p:s1", "path": "/big", "data": data, "compress": "zstd"}),
        )
        .await
        .err_code(ErrorCode::InvalidParams);
    assert!(e.message.ends_with("unknown member 'compress'"), "{e:?}");
    assert_eq!(t.seen.count("files/write"), 1);
    drop(data);

    let v = c
        .call(
            "initialize",
            json!({"processId": 1, "rootUri": null, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        )
        .await
        .ok();
    assert_eq!(v["protocolVersion"], "abx/1");
    let v = c
        .call(
            "templates/list",
            json!({"provider": "p", "platform": "linux/arm64"}),
        )
        .await
        .ok();
    assert_eq!(v["params"]["platform"], "linux/arm64");
}
