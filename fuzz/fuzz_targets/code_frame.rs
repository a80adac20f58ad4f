//! libFuzzer target: a code driver's stdout as the daemon reads it (the body is
//! `abx_fuzz::code_frame`, shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::code_frame(data));
