//! The contract kit's bar (docs/design.md#bars): the whole kit on `local` in at most 2 s, against the
//! reference's kit run (13 s). A real daemon (this bench re-executed as it), a warm-up run,
//! then timed runs of `provider/test {id: "local"}`; prints the median and the ratio.
//! `cargo bench -p abx-broker --bench kit` (`ABX_BENCH_QUICK=1`: one timed run).

mod common;

use common::{Res, Spawned};
use serde_json::json;
use std::time::{Duration, Instant};

/// The reference's kit run on OpenSandbox (the seed's report).
const REFERENCE: Duration = Duration::from_secs(13);
/// The bar.
const BAR: Duration = Duration::from_secs(2);

fn main() {
    common::main("kit", &[], orchestrate);
}

fn orchestrate() -> Res<()> {
    let runs = if common::quick() { 1 } else { 5 };
    let home = tempfile::tempdir().map_err(|e| e.to_string())?;
    let daemon = Spawned::daemon(home.path(), None, &[])?;
    let mut rpc = daemon.rpc()?;
    let mut times = Vec::new();
    for i in 0..=runs {
        let t = Instant::now();
        let v = rpc.call("provider/test", json!({"id": "local"}))?;
        let took = t.elapsed();
        let failed = v["failed"].as_u64().unwrap_or(u64::MAX);
        if failed != 0 {
            return Err(format!("the kit failed on local: {v}"));
        }
        if i > 0 {
            times.push(took);
        }
    }
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "kit on local (median of {runs}): {:.0} ms",
        median.as_secs_f64() * 1e3
    );
    println!(
        "  vs the reference's 13 s kit: {:.3}x; bar <= 2 s: {}",
        median.as_secs_f64() / REFERENCE.as_secs_f64(),
        if median <= BAR { "ok" } else { "MISS" }
    );
    daemon.stop()
}
