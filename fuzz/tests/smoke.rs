//! The fuzzing smoke run of `scripts/fuzz-smoke`: every target's seeds, regressions and local corpus
//! replayed, then mutated for `ABX_FUZZ_SMOKE_SECS` seconds per target (default 5), with the
//! seed from `ABX_FUZZ_SEED` (default: a fixed one, so a run is repeatable).

use std::path::Path;
use std::time::Duration;

fn smoke(name: &str) {
    let secs: f64 = std::env::var("ABX_FUZZ_SMOKE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5.0);
    let seed: u64 = std::env::var("ABX_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0xAB_C0DE);
    let target = abx_fuzz::TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("target")
        .1;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let r = abx_fuzz::smoke::run(
        root,
        name,
        target,
        Duration::from_secs_f64(secs),
        seed ^ name.len() as u64,
    );
    eprintln!(
        "fuzz-smoke {name}: {} inputs replayed, {} mutated inputs in {:.1} s",
        r.replayed,
        r.mutated,
        r.elapsed.as_secs_f64()
    );
}

#[test]
fn codec_line() {
    smoke("codec_line");
}

#[test]
fn codec_header() {
    smoke("codec_header");
}

#[test]
fn decode() {
    smoke("decode");
}

#[test]
fn manifest() {
    smoke("manifest");
}

#[test]
fn epp_reply() {
    smoke("epp_reply");
}

#[test]
fn epp_notification() {
    smoke("epp_notification");
}

#[test]
fn code_frame() {
    smoke("code_frame");
}

#[test]
fn layer() {
    smoke("layer");
}

#[test]
fn image_json() {
    smoke("image_json");
}

#[test]
fn egress_sni() {
    smoke("egress_sni");
}

#[test]
fn egress_policy() {
    smoke("egress_policy");
}
