//! libFuzzer target: a plugin's stdout as the EPP/1 host reads it (the body is
//! `abx_fuzz::epp_reply`, shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::epp_reply(data));
