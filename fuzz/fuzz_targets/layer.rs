//! libFuzzer target: an image layer or archive tar stream, read and applied by the daemon's
//! own code (the body is `abx_fuzz::layer`, shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::layer(data));
