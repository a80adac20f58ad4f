//! libFuzzer target: `FrameCodec` in `Content-Length` framing (the body is
//! `abx_fuzz::codec_header`, shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::codec_header(data));
