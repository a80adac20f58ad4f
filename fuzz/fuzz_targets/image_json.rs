//! libFuzzer target: the JSON of images (indexes, manifests, configs, `docker save`
//! manifests) through the daemon's own parsers (the body is `abx_fuzz::image_json`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| abx_fuzz::image_json(data));
