//! libFuzzer target: `message::decode`, single messages and batches (the body is
//! `abx_fuzz::decode`, shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::decode(data));
