//! libFuzzer target: the egress policy parser and matcher (the body is
//! `abx_fuzz::egress_policy`, shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::egress_policy(data));
