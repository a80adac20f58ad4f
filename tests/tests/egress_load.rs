//! Load through the egress proxy (issue 44, "Tests": 1,000 concurrent connections and a
//! slowloris client leave the daemon and the other sandboxes responsive within their memory
//! bounds). A real daemon under the hostile suites' watch (`watch/mod.rs`: a memory cgroup
//! with a hard limit, a neighbour pinging all along, peak RSS under the documented 256 MiB,
//! RSS back near idle afterwards), a policy sandbox whose Python client opens N connections
//! at once through its proxy (`GET http://load.example/hold`, held by the upstream until the
//! test releases it) plus slowloris connections sending one byte of a head a second, and,
//! while all of that is held open: another sandbox's `exec/run` answers, `broker/ping`
//! answers. Then every connection is accounted for (200 with the body, or 503 beyond the
//! proxy's 256 connections, or closed unanswered beyond its 32 refusals being answered), the
//! slowloris connections are cut (head timeout, 10 s; the large form waits for it), and the
//! proxy serves again.
//!
//! - `a_hundred_connections_and_a_slowloris_through_one_proxy`: 100 connections and 10
//!   slowloris, runs by default (a few seconds).
//! - `a_thousand_connections_and_a_slowloris_through_one_proxy`: 1,000 and 50, `#[ignore]`d
//!   (`scripts/bench egress-load`, or `cargo test -p abx-tests --test egress_load --
//!   --ignored --nocapture`).
//!
//! Traffic goes only to loopback: the upstream listens on 127.0.0.2 in the host's namespace
//! (the daemon's test-only settings, as in `egress.rs`).

use abx_tests::{rss_kib, wait_until, Client, Home};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod watch;
use watch::{wait_alive, Watch};

/// An upstream on 127.0.0.2: `/hold` answers `ok` once released, anything else at once.
struct Upstream {
    port: u16,
    /// `/hold` requests waiting now.
    held: Arc<AtomicUsize>,
    release: Arc<AtomicUsize>,
}

impl Upstream {
    fn start() -> Upstream {
        let l = TcpListener::bind("127.0.0.2:0").expect("bind upstream");
        let port = l.local_addr().unwrap().port();
        let held = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(AtomicUsize::new(0));
        let (h2, r2) = (held.clone(), release.clone());
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut conn) = conn else { continue };
                let (held, release) = (h2.clone(), r2.clone());
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
                    let mut r = BufReader::new(conn.try_clone().unwrap());
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    let body: &[u8] = if line.contains(" /hold ") {
                        held.fetch_add(1, Ordering::SeqCst);
                        let t0 = Instant::now();
                        while release.load(Ordering::SeqCst) == 0
                            && t0.elapsed() < Duration::from_secs(300)
                        {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        held.fetch_sub(1, Ordering::SeqCst);
                        b"ok\n"
                    } else {
                        b"hello\n"
                    };
                    let _ = write!(
                        conn,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(body);
                });
            }
        });
        Upstream {
            port,
            held,
            release,
        }
    }
}

/// The client inside the sandbox: `n` connections at once through the proxy, `slow`
/// slowloris connections opened first. Writes `/tmp/load-state` once the connections are
/// open (2 s after the last was started), then `/tmp/load-result` (JSON) when every
/// connection has ended (and, with `wait_cut`, every slowloris connection was cut).
const LOAD_PY: &str = r#"import asyncio,json,os,resource,sys,time
n,slow,port,wait_cut=int(sys.argv[1]),int(sys.argv[2]),int(sys.argv[3]),sys.argv[4]=='1'
soft,hard=resource.getrlimit(resource.RLIMIT_NOFILE)
want=n+slow+64
if soft<want:
    resource.setrlimit(resource.RLIMIT_NOFILE,(want if hard==resource.RLIM_INFINITY else min(want,hard),hard))
pp=int(os.environ['HTTP_PROXY'].rsplit(':',1)[1])
req=('GET http://load.example:%d/hold HTTP/1.1\r\nHost: load.example:%d\r\n\r\n'%(port,port)).encode()
res={'ok':0,'busy':0,'closed':0,'connect_failed':0,'other':[]}
cut=[]
async def one():
    try:
        r,w=await asyncio.open_connection('127.0.0.1',pp)
    except OSError:
        res['connect_failed']+=1
        return
    data=b''
    try:
        w.write(req)
        await w.drain()
        data=await asyncio.wait_for(r.read(),300)
    except (OSError,asyncio.TimeoutError):
        pass
    w.close()
    if data.startswith(b'HTTP/1.1 200') and data.endswith(b'\r\n\r\nok\n'): res['ok']+=1
    elif data.startswith(b'HTTP/1.1 503'): res['busy']+=1
    elif not data: res['closed']+=1
    else: res['other'].append(data[:120].decode('latin1'))
async def loris():
    t0=time.time()
    r,w=await asyncio.open_connection('127.0.0.1',pp)
    head=b'GET http://load.example:%d/ HTTP/1.1\r\nX-Slow: '%port+b'a'*100000
    try:
        for i in range(len(head)):
            w.write(head[i:i+1])
            await w.drain()
            try:
                await asyncio.wait_for(r.read(1024),1.0)
                break  # an answer or the end: cut
            except asyncio.TimeoutError:
                pass
    except OSError:
        pass
    cut.append(time.time()-t0)
async def main():
    lt=[asyncio.create_task(loris()) for _ in range(slow)]
    await asyncio.sleep(0.5)
    t0=time.time()
    tasks=[asyncio.create_task(one()) for _ in range(n)]
    await asyncio.sleep(2)
    with open('/tmp/load-state.tmp','w') as f:
        json.dump({'ended_so_far':res['busy']+res['closed']+res['connect_failed'],'open_loris':slow-len(cut)},f)
    os.rename('/tmp/load-state.tmp','/tmp/load-state')
    await asyncio.gather(*tasks)
    took=time.time()-t0
    if wait_cut:
        await asyncio.wait_for(asyncio.gather(*lt),60)
    else:
        for t in lt: t.cancel()
        await asyncio.gather(*lt,return_exceptions=True)
    res.update({'seconds':round(took,2),'loris_cut':len(cut),'loris_cut_after_max':round(max(cut),1) if cut else None})
    with open('/tmp/load-result.tmp','w') as f:
        json.dump(res,f)
    os.rename('/tmp/load-result.tmp','/tmp/load-result')
asyncio.run(main())
"#;

fn home() -> (Home, u32) {
    let mut home = Home::new();
    for (k, v) in [
        ("ABX_TEST_HOOKS", "1"),
        ("ABX_TEST_EGRESS_RESOLVE", "load.example=127.0.0.2"),
        ("ABX_TEST_EGRESS_LOOPBACK", "1"),
    ] {
        home.env.push((k.into(), v.into()));
    }
    let pid = home.start();
    (home, pid)
}

/// `cat FILE` in a sandbox, or `None` while it does not exist.
fn read_file(c: &mut Client, id: &str, path: &str) -> Option<Value> {
    let r = c.call(
        "exec/run",
        json!({"sandbox": id, "command": format!("cat {path} 2>/dev/null"), "timeout": 60}),
    );
    if r["exitCode"] != 0 {
        return None;
    }
    serde_json::from_str(r["stdout"].as_str()?).ok()
}

fn load(n: usize, slow: usize, wait_cut: bool) {
    let (home, pid) = home();
    let up = Upstream::start();
    let p = up.port;
    let w = Watch::start(&home, pid);
    let mut c = home.connect();
    let a = c.create(json!({"network": {"allow": [format!("load.example:{p}")]}}));
    let b = c.create(json!({}));
    // The proxy works before the load.
    let r = c.sh(&a, &format!("curl -sS http://load.example:{p}/before"));
    assert_eq!(r["stdout"], "hello\n", "{r}");
    c.call(
        "files/write",
        json!({"sandbox": a, "path": "/tmp/load.py", "data": LOAD_PY}),
    );
    // Started on a connection of its own, never read (its output is small).
    let mut loader = home.connect();
    let started = loader.call(
        "exec/start",
        json!({"sandbox": a, "timeout": 600, "command": format!(
            "python3 /tmp/load.py {n} {slow} {p} {} > /tmp/load-out 2>&1", u8::from(wait_cut)
        )}),
    );
    assert!(started["execId"].is_string(), "{started}");
    let t0 = Instant::now();
    let mut state = None;
    wait_alive("the connections to be open", pid, || {
        state = read_file(&mut c, &a, "/tmp/load-state");
        state.is_some()
    });
    // Held open now: every connection the proxy took waits upstream.
    let expect_held = n.min(256 - slow);
    wait_until(
        "the proxied requests held upstream",
        Duration::from_secs(60),
        || up.held.load(Ordering::SeqCst) >= expect_held.min(n) * 9 / 10,
    );
    let held = up.held.load(Ordering::SeqCst);
    let rss_loaded = rss_kib(pid);
    // Another sandbox's exec answers.
    let t = Instant::now();
    let r = c.sh(&b, "echo still here");
    let exec_ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(r["stdout"], "still here\n", "{r}");
    // broker/ping answers, on a new connection.
    let t = Instant::now();
    let mut fresh = home.connect();
    assert_eq!(fresh.call("broker/ping", Value::Null), json!({}));
    let ping_ms = t.elapsed().as_secs_f64() * 1000.0;
    w.pings_answered(20);
    eprintln!(
        "egress_load: {n} connections + {slow} slowloris: {held} held upstream, daemon RSS {} MiB while held; other sandbox's exec {exec_ms:.1} ms, broker/ping on a new connection {ping_ms:.1} ms; state {}",
        rss_loaded / 1024,
        state.unwrap_or_default()
    );
    assert!(
        exec_ms < 10_000.0,
        "the other sandbox's exec took {exec_ms} ms"
    );
    // Release: every held request is answered, every connection accounted for.
    up.release.store(1, Ordering::SeqCst);
    let mut result = None;
    wait_alive("the load's result", pid, || {
        result = read_file(&mut c, &a, "/tmp/load-result");
        result.is_some()
    });
    let res = result.unwrap();
    let out = c.sh(&a, "cat /tmp/load-out");
    eprintln!(
        "egress_load: result after {:.1} s: {res} {}",
        t0.elapsed().as_secs_f64(),
        out["stdout"].as_str().unwrap_or("")
    );
    let count = |k: &str| res[k].as_u64().unwrap_or(0) as usize;
    assert_eq!(res["other"], json!([]), "unexpected answers: {res}");
    assert_eq!(
        count("ok") + count("busy") + count("closed") + count("connect_failed"),
        n,
        "{res}"
    );
    assert!(count("ok") >= 1 && count("ok") <= 256, "{res}");
    if n + slow <= 256 {
        // Under the proxy's limit: every one went through.
        assert_eq!(count("ok"), n, "{res}");
    } else {
        assert!(
            count("busy") >= 1,
            "nothing refused beyond the limit: {res}"
        );
    }
    if wait_cut {
        assert_eq!(count("loris_cut"), slow, "{res}");
        assert!(
            res["loris_cut_after_max"].as_f64().unwrap_or(99.0) < 30.0,
            "{res}"
        );
    }
    // The proxy serves again.
    let r = c.sh(&a, &format!("curl -sS http://load.example:{p}/after"));
    assert_eq!(r["stdout"], "hello\n", "{r}");
    drop(loader);
    c.call("sandbox/kill", json!({"sandbox": a}));
    c.call("sandbox/kill", json!({"sandbox": b}));
    w.check(&format!(
        "{n} concurrent connections through one sandbox's egress proxy + {slow} slowloris"
    ));
}

/// The small form (runs by default, a few seconds): under the proxy's limit, so all 100 go
/// through.
#[test]
fn a_hundred_connections_and_a_slowloris_through_one_proxy() {
    load(100, 10, false);
}

/// The large form (issue 44): 1,000 at once and 50 slowloris connections, which are cut.
#[test]
#[ignore = "opt-in load (about 30 s): scripts/bench egress-load"]
fn a_thousand_connections_and_a_slowloris_through_one_proxy() {
    load(1000, 50, true);
}
