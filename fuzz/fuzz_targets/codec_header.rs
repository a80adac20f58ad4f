#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::codec_header(data));
