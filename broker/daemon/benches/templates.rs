//! Templates on `local` (issue 22), measured, never asserted:
//!
//! 1. **Create from a cached image** (overlay of the stored rootfs) against `sandbox/create`
//!    without a template: median wall time of N creates each (each killed, untimed, before
//!    the next), ratio printed (bar <= 2x, goal <= 1.2x).
//! 2. **Pull** of a multi-layer test image (busybox plus 6 gzip layers of random data) from a
//!    loopback `docker-registry` into a fresh store (`templates/pull`) against `skopeo copy`
//!    of the same image to a `dir:` (bar <= 1.5x, goal <= 1x). Median of R rounds.
//! 3. **Disk** used by 10 sandboxes of one image, each having written 1 MiB: the data dir's
//!    `du` against the image's size (must be about one image plus their changes).
//!
//! Needs `docker-registry`, `skopeo` and `/bin/busybox` (scripts/test installs them).
//! Usage: `cargo bench -p abx-broker --bench templates`. Environment: `ABX_BENCH_QUICK=1`
//! (fewer rounds), `ABX_BENCH_ROUNDS` (pull rounds, default 5), `ABX_BENCH_CREATES`
//! (default 30).

mod common;
use common::{env_parse, median, Res, Spawned};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

fn main() {
    common::main("templates", &[], orchestrate);
}

fn hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn layer(files: &[(&str, Vec<u8>, u32)], links: &[(&str, &str)]) -> Res<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data, mode) in files {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, &data[..])
            .map_err(|e| e.to_string())?;
    }
    for (name, target) in links {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, name, target)
            .map_err(|e| e.to_string())?;
    }
    b.into_inner().map_err(|e| e.to_string())
}

fn gzip(b: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = e.write_all(b);
    e.finish().unwrap_or_default()
}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An OCI layout dir: busybox + `extra` layers of `size` random bytes each.
fn image(dir: &Path, extra: usize, size: usize) -> Res<u64> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| e.to_string())?;
    let bb = std::fs::read("/bin/busybox").map_err(|e| format!("/bin/busybox: {e}"))?;
    let mut layers = vec![layer(
        &[("bin/busybox", bb, 0o755)],
        &[
            ("bin/sh", "busybox"),
            ("bin/cat", "busybox"),
            ("bin/head", "busybox"),
            ("bin/true", "busybox"),
        ],
    )?];
    for i in 0..extra {
        layers.push(layer(
            &[(&format!("data/{i}.bin"), random(size, i as u64 + 7), 0o644)],
            &[],
        )?);
    }
    let mut descs = Vec::new();
    let mut diff = Vec::new();
    let mut total = 0u64;
    for l in &layers {
        diff.push(format!("sha256:{}", hex(l)));
        let z = gzip(l);
        let h = hex(&z);
        std::fs::write(blobs.join(&h), &z).map_err(|e| e.to_string())?;
        total += z.len() as u64;
        descs.push(json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": format!("sha256:{h}"), "size": z.len()}));
    }
    let cfg = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}, "rootfs": {"type": "layers", "diff_ids": diff}})).map_err(|e| e.to_string())?;
    let ch = hex(&cfg);
    std::fs::write(blobs.join(&ch), &cfg).map_err(|e| e.to_string())?;
    let man = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{ch}"), "size": cfg.len()},
        "layers": descs})).map_err(|e| e.to_string())?;
    let mh = hex(&man);
    std::fs::write(blobs.join(&mh), &man).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .map_err(|e| e.to_string())?;
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{mh}"), "size": man.len(), "annotations": {"org.opencontainers.image.ref.name": "v1"}}]})).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    Ok(total)
}

fn du_kib(p: &Path) -> u64 {
    Command::new("du")
        .arg("-sk")
        .arg(p)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn run(cmd: &mut Command) -> Res<()> {
    let o = cmd.output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(())
}

fn orchestrate() -> Res<()> {
    let quick = common::quick();
    let rounds: usize = env_parse("ABX_BENCH_ROUNDS")?.unwrap_or(if quick { 2 } else { 5 });
    let creates: usize = env_parse("ABX_BENCH_CREATES")?.unwrap_or(if quick { 10 } else { 30 });
    let t = tempfile::tempdir().map_err(|e| e.to_string())?;
    // The registry on a loopback port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let cfg = t.path().join("registry.yml");
    std::fs::write(&cfg, format!("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n", t.path().join("reg").display())).map_err(|e| e.to_string())?;
    let mut reg = Command::new("docker-registry")
        .arg("serve")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("docker-registry: {e}"))?;
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if t0.elapsed().as_secs() > 30 {
            let _ = reg.kill();
            return Err("the registry did not start".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let res = measure(t.path(), port, rounds, creates);
    let _ = reg.kill();
    let _ = reg.wait();
    res
}

fn measure(dir: &Path, port: u16, rounds: usize, creates: usize) -> Res<()> {
    let layout = dir.join("layout");
    let bytes = image(&layout, 6, 8 << 20)?;
    let reference = format!("127.0.0.1:{port}/bench/img:v1");
    run(Command::new("skopeo")
        .args(["--insecure-policy", "copy", "-q", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:v1", layout.display()))
        .arg(format!("docker://{reference}")))?;
    println!(
        "image: 7 layers, {:.1} MiB compressed",
        bytes as f64 / (1 << 20) as f64
    );

    // 2. Pull against skopeo copy to a dir.
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let home = dir.join(format!("pull-home-{r}"));
        let d = Spawned::daemon(&home, None, &[])?;
        let mut c = d.rpc()?;
        c.call("broker/ping", Value::Null)?;
        let t0 = Instant::now();
        c.call(
            "templates/pull",
            json!({"provider": "local", "template": reference}),
        )?;
        ours.push(t0.elapsed().as_secs_f64() * 1000.0);
        d.stop()?;
        let out = dir.join(format!("skopeo-{r}"));
        let t0 = Instant::now();
        run(Command::new("skopeo")
            .args(["--insecure-policy", "copy", "-q", "--src-tls-verify=false"])
            .arg(format!("docker://{reference}"))
            .arg(format!("dir:{}", out.display())))?;
        theirs.push(t0.elapsed().as_secs_f64() * 1000.0);
        let _ = std::fs::remove_dir_all(&out);
        let _ = std::fs::remove_dir_all(&home);
    }
    let (a, b) = (median(&ours).unwrap_or(0.0), median(&theirs).unwrap_or(1.0));
    println!("pull (templates/pull, fetch + verify + unpack): {a:.0} ms; skopeo copy to dir: {b:.0} ms; ratio {:.2}x (bar <= 1.5x, goal <= 1x)", a / b);

    // 1. Create from the cached image against create without a template.
    let home = dir.join("create-home");
    let d = Spawned::daemon(&home, None, &[])?;
    let mut c = d.rpc()?;
    c.call(
        "templates/pull",
        json!({"provider": "local", "template": reference}),
    )?;
    let mut time = |params: Value| -> Res<f64> {
        let mut v = Vec::new();
        for _ in 0..creates {
            let t0 = Instant::now();
            let sb = c.call("sandbox/create", params.clone())?;
            v.push(t0.elapsed().as_secs_f64() * 1000.0);
            c.call("sandbox/kill", json!({"sandbox": sb["id"]}))?;
        }
        Ok(median(&v).unwrap_or(0.0))
    };
    // One of each first (the spare outer process, page cache).
    time(json!({}))?;
    let plain = time(json!({}))?;
    let img = time(json!({"template": reference}))?;
    println!("create: without a template {plain:.1} ms, from the cached image {img:.1} ms; ratio {:.2}x (bar <= 2x, goal <= 1.2x)", img / plain);

    // 3. Disk of 10 sandboxes of one image.
    let data = home.join("data");
    let before = du_kib(&data);
    let mut ids = Vec::new();
    for _ in 0..10 {
        let sb = c.call(
            "sandbox/create",
            json!({"template": reference, "timeout": 600}),
        )?;
        let id = sb["id"].as_str().unwrap_or_default().to_owned();
        c.call(
            "exec/run",
            json!({"sandbox": id, "command": "head -c 1048576 /data/0.bin > /changed.bin"}),
        )?;
        ids.push(id);
    }
    let after = du_kib(&data);
    let store = du_kib(&data.join("local/templates"));
    println!("disk: store (blobs + unpacked rootfs) {:.1} MiB; 10 sandboxes each writing 1 MiB add {:.1} MiB (about their changes)", store as f64 / 1024.0, (after.saturating_sub(before)) as f64 / 1024.0);
    for id in ids {
        c.call("sandbox/kill", json!({"sandbox": id}))?;
    }
    d.stop()
}
