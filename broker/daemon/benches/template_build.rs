//! Dockerfile builds on `local` (issue 49), measured, never asserted, against Debian's
//! `podman build` on the same Dockerfile and context, in the same run:
//!
//! 1. **Cold build**: `FROM` a busybox image (already stored on both sides, pulled untimed
//!    from a loopback `docker-registry`), three `RUN` steps and a `COPY` of 10,000 files; ours
//!    in a fresh store (nothing cached), podman with `--no-cache` (bar <= 1.5x, goal <= 1x).
//! 2. **Warm rebuild** after changing one copied file: the `COPY` and the steps after it run
//!    again, the first `RUN` is cached (bar <= 1x, goal <= 0.5x).
//!
//! podman runs rootless as a non-root user (`ABX_BENCH_PODMAN_USER`, default `abx-nonroot`,
//! when the bench runs as root; with `uidmap`), its storage the native overlay driver. When
//! that cannot run here, root podman is measured and the output says so. Where crun cannot
//! make a rootless container (cgroup v1 hybrid), set `BUILDAH_ISOLATION=chroot` (printed).
//! Usage: `cargo bench -p abx-broker --bench template_build`. Environment:
//! `ABX_BENCH_QUICK=1` (one round), `ABX_BENCH_ROUNDS` (default 3), `ABX_BENCH_FILES`
//! (default 10000).

mod common;
use common::{env_parse, median, Res, Spawned};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

fn main() {
    common::main("template_build", &[], orchestrate);
}

fn hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn e<T: std::fmt::Display>(x: T) -> String {
    x.to_string()
}

/// An OCI layout of busybox (its applets as symlinks).
fn image(dir: &Path) -> Res<()> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(e)?;
    let bb = std::fs::read("/bin/busybox").map_err(|x| format!("/bin/busybox: {x}"))?;
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(bb.len() as u64);
    h.set_mode(0o755);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, "bin/busybox", &bb[..]).map_err(e)?;
    for a in [
        "sh",
        "cat",
        "ls",
        "wc",
        "echo",
        "sha256sum",
        "find",
        "sort",
        "true",
    ] {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, format!("bin/{a}"), "busybox")
            .map_err(e)?;
    }
    let l = b.into_inner().map_err(e)?;
    let diff = format!("sha256:{}", hex(&l));
    let lh = hex(&l);
    std::fs::write(blobs.join(&lh), &l).map_err(e)?;
    let cfg = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}, "rootfs": {"type": "layers", "diff_ids": [diff]},
        // podman's commit wants one history entry a layer.
        "history": [{"created_by": "busybox"}]})).map_err(e)?;
    let ch = hex(&cfg);
    std::fs::write(blobs.join(&ch), &cfg).map_err(e)?;
    let man = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{ch}"), "size": cfg.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": format!("sha256:{lh}"), "size": l.len()}]})).map_err(e)?;
    let mh = hex(&man);
    std::fs::write(blobs.join(&mh), &man).map_err(e)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(e)?;
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{mh}"), "size": man.len(), "annotations": {"org.opencontainers.image.ref.name": "v1"}}]})).map_err(e)?).map_err(e)?;
    Ok(())
}

fn run(cmd: &mut Command) -> Res<()> {
    let o = cmd.output().map_err(e)?;
    if !o.status.success() {
        return Err(format!(
            "{:?}: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(())
}

/// How podman is run: as `user` (rootless) with `home`, or as this user.
struct Podman {
    user: Option<String>,
    home: PathBuf,
    mode: String,
}

impl Podman {
    fn cmd(&self, args: &[&str]) -> Command {
        let env = [
            format!("HOME={}", self.home.display()),
            format!("XDG_RUNTIME_DIR={}", self.home.join("run").display()),
            "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".to_owned(),
        ];
        let mut c = match &self.user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--", "env"]).args(&env).arg("podman");
                c
            }
            None => {
                let mut c = Command::new("env");
                c.args(&env).arg("podman");
                c
            }
        };
        c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
        c
    }

    /// Rootless as `ABX_BENCH_PODMAN_USER` when we are root (native overlay storage under
    /// `dir`), else as ourselves; root podman when rootless does not run.
    fn setup(dir: &Path, reference: &str) -> Res<Podman> {
        let root = unsafe { libc::geteuid() } == 0;
        let user = std::env::var("ABX_BENCH_PODMAN_USER").unwrap_or_else(|_| "abx-nonroot".into());
        let home = dir.join("podman-home");
        let conf = home.join(".config/containers");
        std::fs::create_dir_all(&conf).map_err(e)?;
        std::fs::create_dir_all(home.join("run")).map_err(e)?;
        std::fs::write(
            conf.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"overlay\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                home.join("storage").display(),
                home.join("run/containers").display()
            ),
        )
        .map_err(e)?;
        let rootless = if root {
            let ok = Command::new("id")
                .arg(&user)
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                let _ = Command::new("chown")
                    .args(["-R", &user])
                    .arg(&home)
                    .status();
                let _ = Command::new("chmod")
                    .args(["-R", "a+rwX"])
                    .arg(dir)
                    .status();
                Some(user)
            } else {
                None
            }
        } else {
            None
        };
        let p = Podman {
            mode: match (&rootless, root) {
                (Some(u), _) => {
                    format!("rootless podman as '{u}' (uidmap, native overlay storage)")
                }
                (None, false) => "rootless podman (this user, native overlay storage)".into(),
                (None, true) => "root podman".into(),
            },
            user: rootless,
            home: home.clone(),
        };
        match run(&mut p.cmd(&["pull", "-q", "--tls-verify=false", reference])) {
            Ok(()) => Ok(p),
            Err(x) if p.user.is_some() => {
                println!("rootless podman did not run here ({x}); measuring root podman");
                let p = Podman {
                    user: None,
                    home,
                    mode: "root podman (rootless did not run)".into(),
                };
                run(&mut p.cmd(&["pull", "-q", "--tls-verify=false", reference]))?;
                Ok(p)
            }
            Err(x) => Err(x),
        }
    }
}

fn orchestrate() -> Res<()> {
    let quick = common::quick();
    let rounds: usize = env_parse("ABX_BENCH_ROUNDS")?.unwrap_or(if quick { 1 } else { 3 });
    let files: usize = env_parse("ABX_BENCH_FILES")?.unwrap_or(10_000);
    let t = tempfile::tempdir().map_err(e)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(e)?
        .port();
    let cfg = t.path().join("registry.yml");
    std::fs::write(&cfg, format!("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n", t.path().join("reg").display())).map_err(e)?;
    let mut reg = Command::new("docker-registry")
        .arg("serve")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|x| format!("docker-registry: {x}"))?;
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if t0.elapsed().as_secs() > 30 {
            let _ = reg.kill();
            return Err("the registry did not start".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let res = measure(t.path(), port, rounds, files);
    let _ = reg.kill();
    let _ = reg.wait();
    res
}

fn measure(dir: &Path, port: u16, rounds: usize, files: usize) -> Res<()> {
    let layout = dir.join("layout");
    image(&layout)?;
    let reference = format!("127.0.0.1:{port}/bench/bb:v1");
    run(Command::new("skopeo")
        .args(["--insecure-policy", "copy", "-q", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:v1", layout.display()))
        .arg(format!("docker://{reference}")))?;
    // The context: three RUN steps and a COPY of `files` files.
    let ctx = dir.join("ctx");
    for i in 0..files {
        let d = ctx.join(format!("files/d{}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).map_err(e)?;
        }
        std::fs::write(d.join(format!("f{i}.txt")), format!("file {i}\n")).map_err(e)?;
    }
    std::fs::write(
        ctx.join("Dockerfile"),
        format!("FROM {reference}\nRUN echo one > /one.txt\nCOPY files/ /files/\nRUN find /files -type f | wc -l > /count.txt\nRUN cat /files/d0/f0.txt > /first.txt\n"),
    )
    .map_err(e)?;
    let podman = Podman::setup(dir, &reference)?;
    // crun cannot create a rootless container on a cgroup v1 (hybrid) machine: run the
    // bench with BUILDAH_ISOLATION=chroot there (podman's RUN steps then run chrooted).
    let isolation = std::env::var("BUILDAH_ISOLATION").unwrap_or_else(|_| "oci".into());
    println!(
        "podman: {}, isolation {isolation}; context: {files} files; {rounds} round(s)",
        podman.mode
    );
    let (mut oc, mut ow, mut pc, mut pw) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        std::fs::write(ctx.join("files/d0/f0.txt"), "file 0\n").map_err(e)?;
        // Ours: a fresh store with the base pulled (untimed), then cold and warm.
        let home = dir.join(format!("home-{r}"));
        let d = Spawned::daemon(&home, None, &[])?;
        let mut c = d.rpc()?;
        c.call(
            "templates/pull",
            json!({"provider": "local", "template": reference}),
        )?;
        let params = json!({"provider": "local", "context": ctx, "name": "bench"});
        let t0 = Instant::now();
        c.call("templates/build", params.clone())?;
        oc.push(t0.elapsed().as_secs_f64() * 1000.0);
        std::fs::write(ctx.join("files/d0/f0.txt"), format!("changed {r}\n")).map_err(e)?;
        let t0 = Instant::now();
        let mut cached = Vec::new();
        c.call_with("templates/build", params, |n: &Value| {
            if let Some(b) = n["params"]["cached"].as_bool() {
                cached.push(b);
            }
        })?;
        ow.push(t0.elapsed().as_secs_f64() * 1000.0);
        if r == 0 {
            println!("ours, warm: cache hits per step {cached:?}");
        }
        d.stop()?;
        let _ = std::fs::remove_dir_all(&home);
        // podman: --no-cache cold, then the same change and a cached rebuild.
        std::fs::write(ctx.join("files/d0/f0.txt"), "file 0\n").map_err(e)?;
        let cs = ctx.display().to_string();
        let t0 = Instant::now();
        run(&mut podman.cmd(&[
            "build",
            "-q",
            "--no-cache",
            "--tls-verify=false",
            "-t",
            "bench",
            &cs,
        ]))?;
        pc.push(t0.elapsed().as_secs_f64() * 1000.0);
        std::fs::write(ctx.join("files/d0/f0.txt"), format!("changed {r}\n")).map_err(e)?;
        let t0 = Instant::now();
        run(&mut podman.cmd(&["build", "-q", "--tls-verify=false", "-t", "bench", &cs]))?;
        pw.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let m = |v: &[f64]| median(v).unwrap_or(0.0);
    let (a, b) = (m(&oc), m(&pc));
    println!("cold build (3 RUN, COPY of {files} files): ours {a:.0} ms; {}: {b:.0} ms; ratio {:.2}x (bar <= 1.5x, goal <= 1x)", podman.mode, a / b);
    let (a, b) = (m(&ow), m(&pw));
    println!("warm rebuild (one copied file changed): ours {a:.0} ms; {}: {b:.0} ms; ratio {:.2}x (bar <= 1x, goal <= 0.5x)", podman.mode, a / b);
    let _ = podman.cmd(&["system", "reset", "-f"]).status();
    Ok(())
}
