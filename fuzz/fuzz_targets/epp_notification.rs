//! libFuzzer target: one notification line of a plugin, large ones included, as the EPP/1 host
//! handles it (the body is `abx_fuzz::epp_notification`, shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::epp_notification(data));
