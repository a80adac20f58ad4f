//! The host's unit tests: the call map's hasher, the sweeper, stderr capping.

use super::inflight::*;
use super::reader::*;
use super::spawn::*;
use abx_protocol::{AbxError, ErrorCode};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

#[test]
fn counter_keys_spread_over_the_bits_hashbrown_probes_with() {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let b = BuildHasherDefault::<CounterHasher>::default();
    // hashbrown takes its 7-bit tag from the top of the hash and the bucket from the
    // bottom: consecutive ids must differ in both.
    let tops: std::collections::HashSet<u64> = (0..128i64).map(|k| b.hash_one(k) >> 57).collect();
    let lows: std::collections::HashSet<u64> = (0..128i64).map(|k| b.hash_one(k) & 127).collect();
    assert!(
        tops.len() > 64 && lows.len() > 64,
        "{} {}",
        tops.len(),
        lows.len()
    );
    let mut calls: HashMap<i64, (), BuildHasherDefault<CounterHasher>> = HashMap::default();
    for k in 0..100_000 {
        calls.insert(k, ());
    }
    assert!((0..100_000).all(|k| calls.remove(&k).is_some()) && calls.is_empty());
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn call(
    method: &str,
    limit: Duration,
) -> (Pending, oneshot::Receiver<Result<Box<RawValue>, AbxError>>) {
    let (tx, rx) = oneshot::channel();
    let p = Pending {
        method: method.into(),
        reply: tx,
        conn: None,
        replied: None,
        deadline: Some((Instant::now() + limit, limit)),
        counted: Lent::default(),
    };
    (p, rx)
}

/// A sweeper of its own over an empty map: the map, the sweeper's side, what it writes
/// to the plugin, the plugin's end and the task.
struct Swept {
    pending: Arc<Mutex<Calls>>,
    sw: Arc<Sweep>,
    wrx: mpsc::UnboundedReceiver<Vec<u8>>,
    dead: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn swept(linger: Duration) -> Swept {
    let pending: Arc<Mutex<Calls>> = Arc::default();
    let sw: Arc<Sweep> = Arc::default();
    let (wtx, wrx) = mpsc::unbounded_channel();
    let dead = CancellationToken::new();
    let task = tokio::spawn(sweep(
        "p".into(),
        pending.clone(),
        sw.clone(),
        wtx,
        dead.clone(),
        linger,
    ));
    Swept {
        pending,
        sw,
        wrx,
        dead,
        task,
    }
}

/// A call past its deadline fails E8008 and the plugin hears `$/cancelRequest` for it,
/// even when the sweeper had parked for want of calls, or slept toward a later deadline;
/// a call within its time stays; the sweeper ends with the plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_times_calls_out_after_sleeping_and_ends_with_the_plugin() {
    let Swept {
        pending,
        sw,
        mut wrx,
        dead,
        task,
    } = swept(Duration::from_millis(20));
    until("the idle sweeper parked", || {
        sw.target.load(Ordering::SeqCst) == u64::MAX
    })
    .await;
    let (slow, mut slow_rx) = call("sandbox/list", Duration::from_secs(600));
    assert_eq!(track(&pending, &sw, 1, slow), 1);
    until("the sweeper sleeps toward the slow call's deadline", || {
        sw.target.load(Ordering::SeqCst) != u64::MAX
    })
    .await;
    // Sooner than the deadline the sweeper sleeps toward: it must be woken for it.
    let (hung, hung_rx) = call("exec/run", Duration::from_millis(30));
    assert_eq!(track(&pending, &sw, 2, hung), 2);
    let e = tokio::time::timeout(Duration::from_secs(10), hung_rx)
        .await
        .expect("the hung call timed out")
        .expect("answered, not dropped")
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::PluginTimedOut, "{e:?}");
    assert!(e.message.contains("exec/run"), "{}", e.message);
    let line = wrx.recv().await.unwrap();
    let v: Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(v["method"], "$/cancelRequest");
    assert_eq!(v["params"]["id"], 2);
    // The call within its time is still waiting for the plugin.
    assert!(pending.lock().unwrap().contains_key(&1));
    assert!(slow_rx.try_recv().is_err());
    dead.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the sweeper ended with the plugin")
        .unwrap();
}

/// Calls made back to back, each answered before the next, cost the sweeper no wakeup
/// each (it neither ticks nor wakes per call): it wakes for the first call after it
/// parked, and again only when its linger or a deadline is due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_back_to_back_do_not_wake_the_sweeper_each() {
    let Swept {
        pending,
        sw,
        wrx: _,
        dead,
        task: _,
    } = swept(Duration::from_secs(30));
    until("the sweeper's first scan", || {
        sw.scans.load(Ordering::SeqCst) >= 1
    })
    .await;
    let (mut answered, mut in_flight) = (Vec::new(), Vec::new());
    for id in 0..2000 {
        let (c, rx) = call("sandbox/list", Duration::from_secs(30));
        track(&pending, &sw, id, c);
        // Answered: the reader takes it off the map and replies.
        let c = pending.lock().unwrap().remove(&id).unwrap();
        let _ = c.reply.send(Ok(RawValue::from_string("1".into()).unwrap()));
        answered.push(rx);
        if id % 100 == 0 {
            // Now and then a call stays in flight, with the same time limit as the rest.
            let (c, rx) = call("exec/run", Duration::from_secs(30));
            track(&pending, &sw, 10_000 + id, c);
            in_flight.push(rx);
        }
        tokio::task::yield_now().await;
    }
    // Time passes with calls in flight: a sweeper that ticked would wake in it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let wakes = sw.wakes.load(Ordering::SeqCst);
    assert!(wakes <= 2, "the sweeper woke {wakes} times for 2020 calls");
    assert!(in_flight.iter_mut().all(|rx| rx.try_recv().is_err()));
    dead.cancel();
}

/// Calls with ever shorter time limits, the most a client can make the sweeper do: a
/// wakeup each, but no scan of the calls in flight for any of them (the call lowers the
/// target itself), until the earliest deadline is due; then it fails that call E8008.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ever_shorter_limits_wake_the_sweeper_without_a_scan_each() {
    let Swept {
        pending,
        sw,
        mut wrx,
        dead,
        task: _,
    } = swept(Duration::from_secs(600));
    until("the sweeper's first scan", || {
        sw.scans.load(Ordering::SeqCst) >= 1
    })
    .await;
    let mut rxs = Vec::new();
    for i in 0..500u64 {
        let (c, rx) = call("exec/run", Duration::from_secs(500 - i));
        track(&pending, &sw, i as i64, c);
        rxs.push(rx);
        tokio::task::yield_now().await;
    }
    until("the sweeper saw the wakeups", || {
        sw.wakes.load(Ordering::SeqCst) >= 1
    })
    .await;
    let scans = sw.scans.load(Ordering::SeqCst);
    assert!(
        scans <= 2,
        "{scans} scans for 500 calls none of which is due"
    );
    // A call shorter than all of them is still timed out on time.
    let (c, rx) = call("exec/run", Duration::from_millis(20));
    track(&pending, &sw, 9999, c);
    let e = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("the shortest call timed out")
        .expect("answered, not dropped")
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::PluginTimedOut, "{e:?}");
    let v: Value = serde_json::from_slice(&wrx.recv().await.unwrap()).unwrap();
    assert_eq!(v["params"]["id"], 9999);
    assert!(rxs.iter_mut().all(|rx| rx.try_recv().is_err()));
    dead.cancel();
}

#[tokio::test]
async fn stderr_lines_are_capped_and_logging_is_rate_limited() {
    let mut input: &[u8] = b"short\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\nlast";
    let mut r = tokio::io::BufReader::with_capacity(4, &mut input);
    let mut line = Vec::new();
    assert_eq!(
        read_line_capped(&mut r, &mut line, 8).await.unwrap(),
        Some(false)
    );
    assert_eq!(line, b"short");
    assert_eq!(
        read_line_capped(&mut r, &mut line, 8).await.unwrap(),
        Some(true)
    );
    assert_eq!(line, b"xxxxxxxx");
    assert_eq!(
        read_line_capped(&mut r, &mut line, 8).await.unwrap(),
        Some(false)
    );
    assert_eq!(line, b"last");
    assert_eq!(read_line_capped(&mut r, &mut line, 8).await.unwrap(), None);

    let mut l = LogLimit::default();
    for _ in 0..LOG_LINES_PER_SEC {
        assert_eq!(l.allow(), Some(0));
    }
    assert_eq!(l.allow(), None);
    assert_eq!(l.allow(), None);
    l.window = Some(Instant::now() - Duration::from_secs(2));
    assert_eq!(
        l.allow(),
        Some(2),
        "the next window reports what was dropped"
    );
}
