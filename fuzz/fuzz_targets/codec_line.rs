//! libFuzzer target: `FrameCodec` in newline framing (the body is `abx_fuzz::codec_line`,
//! shared with `scripts/fuzz-smoke`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::codec_line(data));
