//! libFuzzer target: the egress proxy's ClientHello reader (the body is `abx_fuzz::egress_sni`,
//! shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::egress_sni(data));
