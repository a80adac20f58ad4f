//! libFuzzer target: `manifest::parse` on any text (the body is `abx_fuzz::manifest`,
//! shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::manifest(data));
