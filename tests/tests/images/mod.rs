//! Image fixtures shared by the template suites (`templates.rs`, `hostile_archives.rs`): a
//! minimal ustar writer (the tests write their layers byte by byte, hostile ones too), OCI
//! layout directories written by hand, and a busybox base layer (`busybox-static`).
#![allow(dead_code)]

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};

#[derive(Clone)]
pub enum E {
    Dir(&'static str),
    File(String, Vec<u8>, u32),
    Sym(String, String),
    Hard(&'static str, &'static str),
    Dev(&'static str),
}

pub fn header(name: &str, kind: u8, size: usize, mode: u32, link: &str) -> [u8; 512] {
    let mut h = [0u8; 512];
    assert!(name.len() < 100 && link.len() < 100, "{name}");
    h[..name.len()].copy_from_slice(name.as_bytes());
    let oct = |h: &mut [u8; 512], at: usize, len: usize, v: u64| {
        let s = format!("{:0w$o}\0", v, w = len - 1);
        h[at..at + len].copy_from_slice(s.as_bytes());
    };
    oct(&mut h, 100, 8, mode as u64);
    oct(&mut h, 108, 8, 0);
    oct(&mut h, 116, 8, 0);
    oct(&mut h, 124, 12, size as u64);
    oct(&mut h, 136, 12, 1_700_000_000);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    if kind == b'3' {
        oct(&mut h, 329, 8, 1);
        oct(&mut h, 337, 8, 3);
    }
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

pub fn tar(entries: &[E]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        match e {
            E::Dir(n) => out.extend(header(&format!("{n}/"), b'5', 0, 0o755, "")),
            E::File(n, data, mode) => {
                out.extend(header(n, b'0', data.len(), *mode, ""));
                out.extend(data);
                out.resize(out.len().div_ceil(512) * 512, 0);
            }
            E::Sym(n, t) => out.extend(header(n, b'2', 0, 0o777, t)),
            E::Hard(n, t) => out.extend(header(n, b'1', 0, 0o644, t)),
            E::Dev(n) => out.extend(header(n, b'3', 0, 0o666, "")),
        }
    }
    out.extend([0u8; 1024]);
    out
}

pub fn sha256(b: &[u8]) -> String {
    let t = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(t.path(), b).unwrap();
    abx_tests::sha256_file(t.path())
}

pub fn compress(tool: &str, b: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut c = Command::new(tool)
        .args(["-c", "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let mut stdin = c.stdin.take().unwrap();
    let data = b.to_vec();
    let w = std::thread::spawn(move || stdin.write_all(&data));
    let out = c.wait_with_output().unwrap();
    w.join().unwrap().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// Store `b` as a blob of the OCI layout `dir`; returns its digest.
pub fn put_blob(dir: &Path, b: &[u8]) -> String {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let h = sha256(b);
    std::fs::write(blobs.join(&h), b).unwrap();
    format!("sha256:{h}")
}

/// Store an image manifest of `config` (JSON) and `layers` (descriptors) in the layout `dir`;
/// returns the manifest's digest and size.
pub fn put_manifest(dir: &Path, config: &Value, layers: &[Value]) -> (String, usize) {
    let cfg = serde_json::to_vec(config).unwrap();
    let cd = put_blob(dir, &cfg);
    let man = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cfg.len()},
        "layers": layers,
    }))
    .unwrap();
    (put_blob(dir, &man), man.len())
}

/// The layout marker and `index.json` of `dir`, naming the `media` blob `digest` `tag`.
pub fn write_layout_index(dir: &Path, media: &str, digest: &str, size: usize, tag: &str) {
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [{
            "mediaType": media, "digest": digest, "size": size,
            "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
        .unwrap(),
    )
    .unwrap();
}

/// An OCI layout directory holding one image of `layers` (tar, compression) under `tag`.
pub fn oci_layout(dir: &Path, tag: &str, layers: &[(Vec<u8>, &str)], env: &[&str], workdir: &str) {
    oci_layout_as(dir, tag, layers, env, workdir, "")
}

/// [`oci_layout`] with the image config's `User`.
pub fn oci_layout_as(
    dir: &Path,
    tag: &str,
    layers: &[(Vec<u8>, &str)],
    env: &[&str],
    workdir: &str,
    user: &str,
) {
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for (t, how) in layers {
        diff_ids.push(format!("sha256:{}", sha256(t)));
        let (bytes, mt) = match *how {
            "gzip" => (
                compress("gzip", t),
                "application/vnd.oci.image.layer.v1.tar+gzip",
            ),
            "zstd" => (
                compress("zstd", t),
                "application/vnd.oci.image.layer.v1.tar+zstd",
            ),
            _ => (t.clone(), "application/vnd.oci.image.layer.v1.tar"),
        };
        let d = put_blob(dir, &bytes);
        descs.push(json!({"mediaType": mt, "digest": d, "size": bytes.len()}));
    }
    let (md, size) = put_manifest(
        dir,
        &json!({
            "architecture": go_arch(), "os": "linux",
            "config": {"Env": env, "WorkingDir": workdir, "User": user, "Cmd": ["sh"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }),
        &descs,
    );
    write_layout_index(
        dir,
        "application/vnd.oci.image.manifest.v1+json",
        &md,
        size,
        tag,
    );
}

pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    }
}

pub const APPLETS: &[&str] = &[
    "sh", "cat", "ls", "test", "echo", "id", "env", "pwd", "rm", "mkdir", "touch", "stat",
    "readlink",
];

/// The base layer: busybox with its applets as symlinks, a few files the upper layer changes.
pub fn base_layer() -> Vec<u8> {
    let bb = std::fs::read("/bin/busybox").expect("busybox-static (/bin/busybox)");
    let mut e = vec![
        E::Dir("bin"),
        E::Dir("etc"),
        E::Dir("srv"),
        E::Dir("srv/app"),
        E::Dir("opq"),
        E::File("bin/busybox".into(), bb, 0o755),
        E::File(
            "etc/gone.txt".into(),
            b"deleted by the upper layer\n".to_vec(),
            0o644,
        ),
        E::File(
            "opq/old.txt".into(),
            b"hidden by an opaque dir\n".to_vec(),
            0o644,
        ),
        E::File(
            "srv/app/base.txt".into(),
            b"from the base layer\n".to_vec(),
            0o644,
        ),
        E::File(
            "etc/passwd".into(),
            b"root:x:0:0:root:/root:/bin/sh\n".to_vec(),
            0o644,
        ),
    ];
    for a in APPLETS {
        e.push(E::Sym(format!("bin/{a}"), "busybox".into()));
    }
    tar(&e)
}
