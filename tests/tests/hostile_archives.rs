//! Hostile archives and a hostile sandbox against the `local` templates (issue 42): what an
//! image archive, an OCI layout or a layer can make the daemon do while it imports and
//! unpacks it, and what a sandbox can make `templates/build` read while its layer is saved.
//!
//! The archive tests run the daemon in a memory cgroup made here (the harness of
//! `hostile.rs`, copied: a regression is OOM-killed in its cgroup instead of the machine
//! suffering) while another client pings it all along, and check that the daemon lived, its
//! peak RSS (VmHWM) stayed under the documented bound (docs/performance.md "Hostile clients")
//! and the neighbour was answered. Each input is one the code before issue 42 failed on:
//! - a GNU long-name (long-link, PAX) header declaring 3 GB, read whole by the tar crate before
//!   any cap saw an entry;
//! - 100,000 files under one 3.5 KB-deep path, every path kept by the unpacker;
//! - an OCI layout whose blob is a symlink to `/dev/zero` (copied without end), to a host
//!   file, or a FIFO;
//! - whiteout names outside their grammar (`.wh...` emptied `data/local/templates/tmp`);
//! - a file that is not an archive, whose first bytes the error quoted (into the log too);
//! - a registry, or the token server it names, answering a manifest, a token or a blob's error
//!   page of 300 MB or without end (the registry client read them whole).
//!
//! The sandbox test races `renameat2(RENAME_EXCHANGE)` of a directory with a symlink to a
//! secret directory of the host while `templates/build` saves its layer, with a user's daemon
//! (no cgroup, so no freezer: the case where the layer was walked by path while the sandbox
//! ran) and with this test's.

mod images;
mod watch;

use abx_tests::{abx_code, alive, rss_kib, Client, Home};
use images::*;
use serde_json::{json, Value};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use watch::{status_kib, MemCgroup};

const MIB: u64 = 1024 * 1024;
/// The documented bound on the daemon's peak RSS (docs/performance.md "Hostile clients").
const PEAK_BOUND_KIB: u64 = 256 * 1024;
/// The cgroup's hard limit: a safety net above the bound.
const CGROUP_LIMIT: u64 = 768 * MIB;
const LONG: Duration = Duration::from_secs(300);

/// The daemon under a memory cgroup, and a neighbour pinging it all along.
struct Watch {
    pid: u32,
    idle_kib: u64,
    cgroup: Option<MemCgroup>,
    stop: Arc<AtomicBool>,
    pinger: Option<std::thread::JoinHandle<usize>>,
}

impl Watch {
    fn start(home: &Home, pid: u32) -> Watch {
        let cgroup = match MemCgroup::create(CGROUP_LIMIT).and_then(|cg| cg.add(pid).map(|()| cg)) {
            Ok(cg) => Some(cg),
            Err(e) => {
                eprintln!("hostile_archives: running without a memory cgroup: {e}");
                None
            }
        };
        let mut c = home.connect();
        c.call("broker/ping", Value::Null);
        let idle_kib = rss_kib(pid);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let pinger = std::thread::spawn(move || {
            let mut n = 0;
            while !stop2.load(Ordering::Relaxed) {
                // Client::call fails the test if a ping is not answered within 20 s.
                assert_eq!(c.call("broker/ping", Value::Null), json!({}));
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        });
        Watch {
            pid,
            idle_kib,
            cgroup,
            stop,
            pinger: Some(pinger),
        }
    }

    /// The checks, once the hostile input is done with: alive, never OOM-killed, peak RSS
    /// under the bound, the neighbour answered.
    fn check(mut self, what: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let n = self
            .pinger
            .take()
            .unwrap()
            .join()
            .expect("the neighbour's pings were answered");
        assert!(n > 0, "{what}: no ping answered");
        assert!(alive(self.pid), "{what}: the daemon died");
        if let Some(cg) = &self.cgroup {
            assert_eq!(cg.oom_kills(), 0, "{what}: OOM kill in the daemon's cgroup");
        }
        let peak = status_kib(self.pid, "VmHWM");
        eprintln!(
            "hostile_archives: {what}: peak RSS {} MiB (idle {} MiB), {n} pings answered, cgroup {}",
            peak / 1024,
            self.idle_kib / 1024,
            if self.cgroup.is_some() { "yes" } else { "no" }
        );
        assert!(
            peak <= PEAK_BOUND_KIB,
            "{what}: peak RSS {peak} KiB above the {PEAK_BOUND_KIB} KiB bound"
        );
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// These tests load the machine on purpose: one at a time whatever `--test-threads` says.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A daemon of a fresh home, watched; a client with a long read timeout (imports of many
/// files take a while on a loaded machine).
fn watched() -> (Home, Watch, Client) {
    let home = Home::new();
    let pid = home.start();
    let w = Watch::start(&home, pid);
    let c = home.connect();
    c.stream.set_read_timeout(Some(LONG)).unwrap();
    (home, w, c)
}

fn import_err(c: &mut Client, path: &Path, name: &str) -> Value {
    c.call_err(
        "templates/import",
        json!({"provider": "local", "path": path, "name": name}),
    )
}

fn store(home: &Home) -> PathBuf {
    home.path.join("data/local/templates")
}

/// Bytes of every file beneath `p` (not following symlinks).
fn du(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => du(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// Every regular file beneath `p` that holds `needle` (symlinks are not followed).
fn files_holding(p: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(p) else {
        return out;
    };
    for e in rd.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => out.extend(files_holding(&e.path(), needle)),
            Ok(t)
                if t.is_file()
                    && std::fs::read(e.path())
                        .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) =>
            {
                out.push(e.path());
            }
            _ => {}
        }
    }
    out
}

fn marker(what: &str) -> String {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    format!(
        "ABXSECRET{what}{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

// ---------------------------------------------------------------------------------------------
// Header-declared sizes
// ---------------------------------------------------------------------------------------------

/// An archive whose first member is an extension record (`L` GNU long name, `K` long link,
/// `x` PAX) declaring 3 GB, with the 3 GB there (a sparse file: zeros): the tar crate read the
/// record whole into memory before any cap saw an entry. It is refused at its header.
#[test]
fn an_extension_header_declaring_3_gb_is_refused_before_it_is_read() {
    let _one = serial();
    let (home, w, mut c) = watched();
    let t = tempfile::tempdir().unwrap();
    for kind in [b'L', b'K', b'x'] {
        let p = t.path().join(format!("huge-{}.tar", kind as char));
        let mut f = std::fs::File::create(&p).unwrap();
        let name = if kind == b'x' {
            "PaxHeaders/huge"
        } else {
            "././@LongLink"
        };
        f.write_all(&header(name, kind, 3_000_000_000, 0o644, ""))
            .unwrap();
        f.set_len(512 + 3_000_000_000 + 1024).unwrap();
        drop(f);
        let e = import_err(&mut c, &p, "huge:1");
        let msg = e["message"].as_str().unwrap_or_default().to_owned();
        eprintln!("{}: {e}", kind as char);
        assert_ne!(abx_code(&e), "E9001", "{e}");
        assert!(msg.contains("65536"), "the error names the cap: {e}");
    }
    assert_eq!(du(&store(&home).join("tmp")), 0, "nothing left behind");
    w.check("extension headers declaring 3 GB");
}

// ---------------------------------------------------------------------------------------------
// Many files under a deep path
// ---------------------------------------------------------------------------------------------

/// `n` empty files under one directory whose path is about 3.5 KB (GNU long names), zstd
/// compressed, streamed to `out`.
fn deep_tar_zst(out: &Path, n: usize) {
    let f = std::fs::File::create(out).unwrap();
    let mut z = Command::new("zstd")
        .args(["-1", "-q", "-c"])
        .stdin(Stdio::piped())
        .stdout(f)
        .spawn()
        .expect("zstd");
    let mut w = std::io::BufWriter::with_capacity(1 << 20, z.stdin.take().unwrap());
    let dir = "d/".repeat(1745);
    for i in 0..n {
        let name = format!("{dir}f{i:07}");
        let data = format!("{name}\0");
        w.write_all(&header("././@LongLink", b'L', data.len(), 0o644, ""))
            .unwrap();
        w.write_all(data.as_bytes()).unwrap();
        w.write_all(&vec![0u8; data.len().div_ceil(512) * 512 - data.len()])
            .unwrap();
        w.write_all(&header(&name[..99], b'0', 0, 0o644, ""))
            .unwrap();
    }
    w.write_all(&[0u8; 1024]).unwrap();
    drop(w);
    assert!(z.wait().unwrap().success());
}

/// 100,000 files under one 3.5 KB-deep path, as an archive to import and as a layer of an
/// OCI layout: the unpacker kept every path it made (over 350 MB of paths); it streams them.
#[test]
fn many_files_under_a_deep_path_unpack_in_bounded_memory() {
    let _one = serial();
    let (home, w, mut c) = watched();
    let t = tempfile::tempdir().unwrap();
    let zst = t.path().join("deep.tar.zst");
    let t0 = Instant::now();
    deep_tar_zst(&zst, 100_000);
    eprintln!(
        "deep archive: {} bytes in {:.1} s",
        std::fs::metadata(&zst).unwrap().len(),
        t0.elapsed().as_secs_f64()
    );
    // As an archive: extracted, then refused (neither docker save nor an OCI layout).
    let t0 = Instant::now();
    let e = import_err(&mut c, &zst, "deep:1");
    eprintln!("as an archive: {e} in {:.1} s", t0.elapsed().as_secs_f64());
    assert_ne!(abx_code(&e), "E9001", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("manifest.json"),
        "{e}"
    );
    // As a layer.
    let layout = t.path().join("layout");
    let blob = std::fs::read(&zst).unwrap();
    let d = put_blob(&layout, &blob);
    let (md, size) = put_manifest(
        &layout,
        &json!({"architecture": go_arch(), "os": "linux", "config": {},
                "rootfs": {"type": "layers", "diff_ids": []}}),
        &[
            json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": d, "size": blob.len()}),
        ],
    );
    write_layout_index(
        &layout,
        "application/vnd.oci.image.manifest.v1+json",
        &md,
        size,
        "v1",
    );
    let t0 = Instant::now();
    let r = c.call(
        "templates/import",
        json!({"provider": "local", "path": layout, "name": "deep:1"}),
    );
    eprintln!(
        "as a layer: imported in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let root = store(&home)
        .join("images")
        .join(r["digest"].as_str().unwrap().trim_start_matches("sha256:"))
        .join("rootfs");
    let deep = root.join("d/".repeat(1745).trim_end_matches('/'));
    let n = std::process::Command::new("sh")
        .arg("-c")
        .arg("ls -f . | wc -l")
        .current_dir(&deep)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&n.stdout).trim(),
        "100002",
        "every file made (and . ..)"
    );
    w.check("100,000 files under a 3.5 KB-deep path");
}

// ---------------------------------------------------------------------------------------------
// Blobs that are not files of the layout
// ---------------------------------------------------------------------------------------------

/// A layout of one image whose layer descriptor names `digest` (`size` bytes); the caller
/// puts what it likes at `blobs/sha256/<hex>`.
fn layout_naming(dir: &Path, digest: &str, size: u64) {
    let (md, msize) = put_manifest(
        dir,
        &json!({"architecture": go_arch(), "os": "linux", "config": {},
                "rootfs": {"type": "layers", "diff_ids": [digest]}}),
        &[
            json!({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size}),
        ],
    );
    write_layout_index(
        dir,
        "application/vnd.oci.image.manifest.v1+json",
        &md,
        msize,
        "v1",
    );
}

/// While it runs: the store's temp dir is watched, and the daemon killed should it grow past
/// 256 MiB (the code before copied `/dev/zero` into it without end).
struct DiskGuard {
    stop: Arc<AtomicBool>,
    killed: Arc<AtomicBool>,
    t: Option<std::thread::JoinHandle<()>>,
}

impl DiskGuard {
    fn start(home: &Home, pid: u32) -> DiskGuard {
        let stop = Arc::new(AtomicBool::new(false));
        let killed = Arc::new(AtomicBool::new(false));
        let (s, k) = (stop.clone(), killed.clone());
        let dir = store(home);
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if du(&dir) > 256 * MIB {
                    // SAFETY: kill(2) of the test's own daemon.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    k.store(true, Ordering::Relaxed);
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        DiskGuard {
            stop,
            killed,
            t: Some(t),
        }
    }

    fn check(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.t.take().unwrap().join().unwrap();
        assert!(
            !self.killed.load(Ordering::Relaxed),
            "the daemon copied past 256 MiB into the store (killed)"
        );
    }
}

/// Blobs of an OCI layout that are a symlink to `/dev/zero`, a symlink to a host file whose
/// digest they claim (a regular file, but not the layout's), a FIFO, a directory, and an
/// `index.json` that is a symlink: each is refused without being read, and nothing of the
/// host file is stored.
#[test]
fn layout_blobs_that_are_symlinks_fifos_or_dirs_are_refused_without_reading_them() {
    let _one = serial();
    let (home, w, mut c) = watched();
    let guard = DiskGuard::start(&home, w.pid);
    let t = tempfile::tempdir().unwrap();
    let secret = marker("blob");
    let host_file = t.path().join("host-secret.tar");
    std::fs::write(
        &host_file,
        tar(&[E::File(
            "secret.txt".into(),
            secret.clone().into_bytes(),
            0o644,
        )]),
    )
    .unwrap();
    let host_digest = format!("sha256:{}", sha256(&std::fs::read(&host_file).unwrap()));
    let zero_digest = format!("sha256:{}", "0".repeat(64));
    type Plant = Box<dyn Fn(&Path)>;
    let hf = host_file.clone();
    let cases: Vec<(&str, String, u64, Plant)> = vec![
        (
            "symlink to /dev/zero",
            zero_digest.clone(),
            1 << 20,
            Box::new(|p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap()),
        ),
        (
            "symlink to a host file",
            host_digest.clone(),
            std::fs::metadata(&host_file).unwrap().len(),
            Box::new(move |p: &Path| std::os::unix::fs::symlink(&hf, p).unwrap()),
        ),
        (
            "directory",
            zero_digest.clone(),
            512,
            Box::new(|p: &Path| std::fs::create_dir(p).unwrap()),
        ),
        (
            "fifo",
            zero_digest.clone(),
            512,
            Box::new(|p: &Path| {
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: mkfifo of a path in our temp dir.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            }),
        ),
    ];
    for (i, (what, digest, size, plant)) in cases.iter().enumerate() {
        let dir = t.path().join(format!("layout{i}"));
        layout_naming(&dir, digest, *size);
        plant(
            &dir.join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:")),
        );
        let t0 = Instant::now();
        let e = import_err(&mut c, &dir, "blob:1");
        eprintln!("{what}: {e} in {:.1} s", t0.elapsed().as_secs_f64());
        assert_ne!(abx_code(&e), "E9001", "{what}: {e}");
        assert!(
            !e.to_string().contains(&secret),
            "{what}: the host file is quoted"
        );
    }
    // A regular file longer than its descriptor says: refused, not copied past it.
    let dir = t.path().join("longer");
    let long = vec![7u8; 4 << 20];
    let d = put_blob(&dir, &long);
    layout_naming(&dir, &d, 1024);
    let e = import_err(&mut c, &dir, "longer:1");
    eprintln!("longer than declared: {e}");
    assert_ne!(abx_code(&e), "E9001", "{e}");
    // A docker save directory whose layer is a symlink to /dev/zero (its diff_id was hashed
    // from it to the store's cap, 16 GiB of zeros).
    let save = t.path().join("save");
    std::fs::create_dir_all(save.join("l1")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", save.join("l1/layer.tar")).unwrap();
    let cfg = serde_json::to_vec(&json!({
        "architecture": go_arch(), "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [zero_digest]},
    }))
    .unwrap();
    std::fs::write(save.join("config.json"), &cfg).unwrap();
    std::fs::write(
        save.join("manifest.json"),
        json!([{"Config": "config.json", "Layers": ["l1/layer.tar"]}]).to_string(),
    )
    .unwrap();
    let t0 = Instant::now();
    let e = import_err(&mut c, &save, "save:1");
    eprintln!(
        "docker save layer -> /dev/zero: {e} in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert_ne!(abx_code(&e), "E9001", "{e}");
    // index.json itself a symlink to the index of another layout.
    let real = t.path().join("real");
    build_image(&real);
    let linked = t.path().join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::fs::write(linked.join("oci-layout"), "{}").unwrap();
    std::os::unix::fs::symlink(real.join("index.json"), linked.join("index.json")).unwrap();
    let e = import_err(&mut c, &linked, "linked:1");
    assert_ne!(abx_code(&e), "E9001", "{e}");
    // The path given is itself a FIFO, or /dev/zero: refused without reading (a FIFO's open
    // would wait for a writer).
    let fifo = t.path().join("archive.fifo");
    let cf = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo of a path in our temp dir.
    assert_eq!(unsafe { libc::mkfifo(cf.as_ptr(), 0o644) }, 0);
    for p in [fifo.as_path(), Path::new("/dev/zero")] {
        let e = import_err(&mut c, p, "special:1");
        eprintln!("{}: {e}", p.display());
        assert_ne!(abx_code(&e), "E9001", "{e}");
    }
    guard.check();
    assert!(
        files_holding(&store(&home), secret.as_bytes()).is_empty(),
        "the host file was stored"
    );
    assert_eq!(du(&store(&home).join("tmp")), 0, "nothing left behind");
    // The store still imports a good layout.
    c.call(
        "templates/import",
        json!({"provider": "local", "path": real, "name": "good:1", "tag": "v1"}),
    );
    w.check("layout blobs that are not files of the layout");
}

fn build_image(dir: &Path) {
    oci_layout(dir, "v1", &[(base_layer(), "gzip")], &["PATH=/bin"], "/srv");
}

// ---------------------------------------------------------------------------------------------
// Whiteout names
// ---------------------------------------------------------------------------------------------

/// Whiteout names outside their grammar (`.wh...`, `.wh..`, `.wh.`, `.wh..wh.x`) are never
/// acted on, in an archive or in a layer; whiteouts mean nothing in an archive (only in the
/// layers it holds); a layer's good whiteouts and opaque markers still apply.
#[test]
fn whiteout_names_outside_their_grammar_are_never_acted_on() {
    let _one = serial();
    let (home, w, mut c) = watched();
    let tmp = store(&home).join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("canary"), "still here").unwrap();
    let images = store(&home).join("images");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::write(images.join("canary"), "still here").unwrap();
    let t = tempfile::tempdir().unwrap();
    let bad_names = [
        ".wh...",
        ".wh..",
        ".wh.",
        ".wh..wh.plnk",
        "a/.wh...",
        "a/.wh..",
    ];
    // An archive of nothing but bad whiteouts.
    let mut e: Vec<E> = vec![E::Dir("a")];
    e.extend(
        bad_names
            .iter()
            .map(|n| E::File(n.to_string(), vec![], 0o644)),
    );
    let p = t.path().join("wh.tar");
    std::fs::write(&p, tar(&e)).unwrap();
    let err = import_err(&mut c, &p, "wh:1");
    assert_ne!(abx_code(&err), "E9001", "{err}");
    assert_eq!(
        std::fs::read_to_string(tmp.join("canary")).ok().as_deref(),
        Some("still here"),
        "the store's temp dir was emptied: {err}"
    );
    // A docker save archive with a whiteout of its own manifest: nothing in an archive is
    // whited out (the import goes through).
    let save = t.path().join("save");
    std::fs::create_dir_all(save.join("l1")).unwrap();
    let l1 = base_layer();
    std::fs::write(save.join("l1/layer.tar"), &l1).unwrap();
    let cfg = serde_json::to_vec(&json!({
        "architecture": go_arch(), "os": "linux", "config": {"Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", sha256(&l1))]},
    }))
    .unwrap();
    let ch = sha256(&cfg);
    std::fs::write(save.join(format!("{ch}.json")), &cfg).unwrap();
    std::fs::write(
        save.join("manifest.json"),
        serde_json::to_vec(&json!([{"Config": format!("{ch}.json"), "RepoTags": ["wh/save:1"], "Layers": ["l1/layer.tar"]}])).unwrap(),
    )
    .unwrap();
    std::fs::write(save.join(".wh.manifest.json"), "").unwrap();
    std::fs::write(save.join(".wh...."), "").unwrap();
    let archive = t.path().join("save.tar");
    // The whiteouts come after what they name.
    let st = Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&save)
        .args([
            "manifest.json",
            "l1",
            &format!("{ch}.json"),
            ".wh.manifest.json",
            ".wh....",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let r = c.call(
        "templates/import",
        json!({"provider": "local", "path": archive}),
    );
    assert_eq!(r["name"], "wh/save:1", "{r}");
    // A layer with the bad names at its root and in a directory, beside good ones.
    let mut top = vec![
        E::File("etc/.wh.passwd".into(), vec![], 0o644),
        E::Dir("opq"),
        E::File("opq/.wh..wh..opq".into(), vec![], 0o644),
        E::File("opq/new.txt".into(), b"new\n".to_vec(), 0o644),
    ];
    top.extend(
        bad_names
            .iter()
            .map(|n| E::File(n.to_string(), vec![], 0o644)),
    );
    let lower = tar(&[
        E::Dir("etc"),
        E::File("etc/passwd".into(), b"x\n".to_vec(), 0o644),
        E::File("etc/kept".into(), b"kept\n".to_vec(), 0o644),
        E::Dir("opq"),
        E::File("opq/old.txt".into(), b"old\n".to_vec(), 0o644),
        E::Dir("a"),
        E::File("a/kept".into(), b"kept\n".to_vec(), 0o644),
    ]);
    let layout = t.path().join("layout");
    oci_layout(
        &layout,
        "v1",
        &[(lower, "plain"), (tar(&top), "plain")],
        &[],
        "",
    );
    let r = c.call(
        "templates/import",
        json!({"provider": "local", "path": layout, "name": "wh/layer:1"}),
    );
    let root = images
        .join(r["digest"].as_str().unwrap().trim_start_matches("sha256:"))
        .join("rootfs");
    assert!(!root.join("etc/passwd").exists(), "a good whiteout applies");
    assert_eq!(
        std::fs::read_to_string(root.join("etc/kept")).unwrap(),
        "kept\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("a/kept")).unwrap(),
        "kept\n",
        "a bad whiteout in a/ acted"
    );
    assert!(
        !root.join("opq/old.txt").exists(),
        "the opaque marker applies"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("opq/new.txt")).unwrap(),
        "new\n"
    );
    for n in bad_names {
        assert!(
            std::fs::symlink_metadata(root.join(n)).is_err(),
            "{n} made as a file"
        );
    }
    assert_eq!(
        std::fs::read_to_string(images.join("canary"))
            .ok()
            .as_deref(),
        Some("still here"),
        "the images dir was emptied"
    );
    assert_eq!(
        std::fs::read_to_string(tmp.join("canary")).ok().as_deref(),
        Some("still here")
    );
    w.check("whiteout names outside their grammar");
}

// ---------------------------------------------------------------------------------------------
// Errors never quote a file
// ---------------------------------------------------------------------------------------------

/// A file that is no archive (a shadow file), imported as an archive and as a layer, and JSON
/// files whose values are of the wrong type: the errors say what is wrong and where, and never
/// quote the file (neither in the reply nor in the log).
#[test]
fn import_errors_never_quote_the_file() {
    let _one = serial();
    let (home, w, mut c) = watched();
    let t = tempfile::tempdir().unwrap();
    let secret = marker("shadow");
    let mut shadow = format!("root:$y$j9T${secret}$hashhashhash:19700:0:99999:7:::\n");
    for u in [
        "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news",
    ] {
        shadow.push_str(&format!("{u}:*:19700:0:99999:7:::\n"));
    }
    while shadow.len() < 2048 {
        shadow.push_str("user:$y$j9T$abcdefghijklmnopqrstuv$0123456789:19700:0:99999:7:::\n");
    }
    let p = t.path().join("shadow");
    std::fs::write(&p, &shadow).unwrap();
    let check = |c: &mut Client, path: &Path, name: &str| {
        // A reply (an error, or a lenient import of wrong-typed JSON) never quotes the file.
        let r = c.request(
            "templates/import",
            json!({"provider": "local", "path": path, "name": name}),
        );
        eprintln!("{name}: {r}");
        assert!(!r.to_string().contains(&secret), "quoted in a reply: {r}");
        if let Some(e) = r.get("error") {
            assert_ne!(abx_code(e), "E9001", "{e}");
        }
        r
    };
    assert!(check(&mut c, &p, "shadow:1").get("error").is_some());
    // The same file as the layer of a layout (its digest right).
    let layout = t.path().join("layout");
    let d = put_blob(&layout, shadow.as_bytes());
    layout_naming(&layout, &d, shadow.len() as u64);
    assert!(check(&mut c, &layout, "shadow:2").get("error").is_some());
    // JSON of the wrong types, holding the secret.
    let j = t.path().join("json-index");
    std::fs::create_dir_all(&j).unwrap();
    std::fs::write(j.join("oci-layout"), "{}").unwrap();
    std::fs::write(
        j.join("index.json"),
        json!({"manifests": secret}).to_string(),
    )
    .unwrap();
    check(&mut c, &j, "json:1");
    let j = t.path().join("json-config");
    let (md, size) = put_manifest(
        &j,
        &json!({"config": {"Env": secret, "WorkingDir": [secret]}}),
        &[],
    );
    write_layout_index(
        &j,
        "application/vnd.oci.image.manifest.v1+json",
        &md,
        size,
        "v1",
    );
    check(&mut c, &j, "json:2");
    let j = t.path().join("json-save");
    std::fs::create_dir_all(&j).unwrap();
    std::fs::write(
        j.join("manifest.json"),
        json!([{"Config": [secret], "Layers": secret}]).to_string(),
    )
    .unwrap();
    check(&mut c, &j, "json:3");
    let log = std::fs::read_to_string(home.log_file()).unwrap_or_default();
    assert!(!log.contains(&secret), "quoted in the log");
    w.check("errors on files that are not archives");
}

// ---------------------------------------------------------------------------------------------
// templates/build against a sandbox racing symlink swaps
// ---------------------------------------------------------------------------------------------

/// A static program that swaps two paths with `renameat2(RENAME_EXCHANGE)` for ever.
fn swapper(dir: &Path) -> Vec<u8> {
    let src = dir.join("swap.c");
    std::fs::write(
        &src,
        r#"#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    for (;;) syscall(SYS_renameat2, AT_FDCWD, argv[1], AT_FDCWD, argv[2], 2 /* RENAME_EXCHANGE */);
}
"#,
    )
    .unwrap();
    let bin = dir.join("swap");
    let out = Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc -static: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(bin).unwrap()
}

/// A home whose daemon runs as `user` (None: as this test), driven through the CLI as that
/// user (a daemon serves its own uid only).
struct UserHome {
    home: Home,
    user: Option<u32>,
}

impl UserHome {
    fn new(user: Option<u32>) -> UserHome {
        let home = Home::new();
        if let Some(u) = user {
            chown_r(&home.path, u);
        }
        UserHome { home, user }
    }

    fn abx(&self, args: &[&str]) -> String {
        use std::os::unix::process::CommandExt;
        let mut c = self.home.abx();
        if let Some(u) = self.user {
            c.uid(u).gid(u).env("HOME", &self.home.path);
        }
        let out = c.args(args).output().expect("abx");
        assert!(
            out.status.success(),
            "abx {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for UserHome {
    fn drop(&mut self) {
        if let Some(u) = self.user {
            use std::os::unix::process::CommandExt;
            let _ = self
                .home
                .abx()
                .uid(u)
                .gid(u)
                .env("HOME", &self.home.path)
                .args(["broker", "stop"])
                .output();
        }
    }
}

fn chown_r(p: &Path, u: u32) {
    let st = Command::new("chown")
        .arg("-R")
        .arg(format!("{u}:{u}"))
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A sandbox swaps a directory of its root with a symlink to the user's `~/.ssh` (on the host,
/// outside anything it sees) as fast as it can while `templates/build` saves its layer, eight
/// times: the key never reaches a layer blob or a built root, and each build still saves the
/// sandbox's files.
fn build_never_follows_a_racing_symlink(user: Option<u32>) {
    let uh = UserHome::new(user);
    let home = &uh.home;
    // The user's key, where the sandbox cannot see it.
    let secret = marker("key");
    let ssh = home.path.join(".ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    std::fs::write(
        ssh.join("id_ed25519"),
        format!(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n{secret}\n-----END OPENSSH PRIVATE KEY-----\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o700)).unwrap();
    // The image: busybox and the swapper.
    let img = home.path.join("img");
    std::fs::create_dir_all(&img).unwrap();
    let swap = swapper(&img);
    oci_layout(
        &img,
        "v1",
        &[
            (base_layer(), "gzip"),
            (tar(&[E::File("bin/swap".into(), swap, 0o755)]), "plain"),
        ],
        &["PATH=/bin"],
        "/srv",
    );
    if let Some(u) = user {
        chown_r(&home.path, u);
    }
    uh.abx(&[
        "template",
        "import",
        &img.display().to_string(),
        "race/bb:1",
    ]);
    let sb: Value = serde_json::from_str(&uh.abx(&["-j", "create", "--template", "race/bb:1"]))
        .expect("create");
    let id = sb["id"].as_str().unwrap().to_owned();
    let target = ssh.display().to_string();
    uh.abx(&[
        "exec",
        &id,
        &format!(
            "mkdir -p /srv/race/d && echo normal > /srv/race/d/file && ln -s {target} /srv/race/s \
             && echo kept > /srv/keep.txt && (swap /srv/race/d /srv/race/s </dev/null >/dev/null 2>&1 &)"
        ),
    ]);
    swapping(&uh, &id, "before the builds");
    let images = home.path.join("data/local/templates/images");
    for n in 0..8 {
        let r: Value = serde_json::from_str(&uh.abx(&[
            "-j",
            "template",
            "build",
            &id,
            &format!("race/saved:{n}"),
        ]))
        .expect("build");
        let hex = r["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:")
            .to_owned();
        let leaked = files_holding(&home.path.join("data/local/templates"), secret.as_bytes());
        assert!(
            leaked.is_empty(),
            "build {n}: the user's key is in the template: {leaked:?}"
        );
        // The build saved the sandbox's files: its own file, and the race dir as one of its
        // two states (a directory with the file, and the symlink, whichever way round).
        let root = images.join(&hex).join("rootfs");
        assert_eq!(
            std::fs::read_to_string(root.join("srv/keep.txt")).unwrap(),
            "kept\n",
            "build {n}"
        );
        let (mut dirs, mut links) = (0, 0);
        for name in ["d", "s"] {
            let p = root.join("srv/race").join(name);
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                assert_eq!(std::fs::read_link(&p).unwrap(), ssh, "build {n}");
                links += 1;
            } else {
                assert!(m.is_dir(), "build {n}: {name}");
                assert_eq!(
                    std::fs::read_to_string(p.join("file")).unwrap(),
                    "normal\n",
                    "build {n}"
                );
                dirs += 1;
            }
        }
        assert_eq!((dirs, links), (1, 1), "build {n}");
    }
    // The sandbox goes on racing after the builds (it was resumed each time).
    swapping(&uh, &id, "after the builds");
}

/// Asserts the swapper runs: `/srv/race/d` is seen both as a symlink and not (sampled until
/// both are seen, at most 200,000 times: the swapper may wait for a CPU a while).
fn swapping(uh: &UserHome, id: &str, when: &str) {
    let seen = uh.abx(&[
        "exec",
        id,
        "l=0; d=0; i=0; while [ $i -lt 200000 ] && { [ $l -eq 0 ] || [ $d -eq 0 ]; }; do \
         if [ -L /srv/race/d ]; then l=$((l+1)); else d=$((d+1)); fi; i=$((i+1)); done; echo $l $d",
    ]);
    let n: Vec<u64> = seen
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        n.len() == 2 && n[0] > 0 && n[1] > 0,
        "the swapper does not run {when}: symlink/directory seen {seen:?} times"
    );
}

#[test]
fn templates_build_never_follows_a_sandbox_s_symlink_swaps_as_a_user_s_daemon() {
    let _one = serial();
    // SAFETY: geteuid has no arguments.
    let user = (unsafe { libc::geteuid() } == 0).then_some(65534);
    build_never_follows_a_racing_symlink(user);
}

#[test]
fn templates_build_never_follows_a_sandbox_s_symlink_swaps_as_this_test_s_daemon() {
    let _one = serial();
    build_never_follows_a_racing_symlink(None);
}

/// How a hostile registry answers the request [`At`] names.
#[derive(Clone, Copy)]
enum Answer {
    /// 200 declaring `Content-Length: n` and sending that many bytes.
    Declared(u64),
    /// 200, chunked, without end (until `SENT_AT_MOST`).
    Endless,
    /// `status`, with an endless chunked body holding the marker (an error page).
    EndlessError(u16),
}

/// Which request of a pull a hostile registry answers as its [`Answer`] says.
#[derive(Clone, Copy, PartialEq)]
enum At {
    /// The manifest (`/v2/` is open).
    Manifest,
    /// The token server's answer: `/v2/` asks for a Bearer token from the realm `/token` of
    /// the same server.
    Token,
    /// Every blob: the manifest is a good one, naming a config of 100 bytes and a layer of
    /// 1000.
    Blob,
}

/// The most a hostile registry sends on one answer (a bound for the test itself, should the
/// daemon read on).
const SENT_AT_MOST: u64 = 1 << 30;

/// A registry on loopback that answers `/v2/` with `{}` (or, `at` [`At::Token`], a Bearer
/// challenge naming its own `/token`), a manifest well unless `at` is [`At::Manifest`], and
/// the request `at` names as `answer` says, its bodies `x`s after `head` (the marker in error
/// pages and token answers). Returns its `host:port`.
fn hostile_registry(at: At, answer: Answer, head: String) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let realm = format!("http://{addr}/token");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { return };
            let head = head.clone();
            let realm = realm.clone();
            std::thread::spawn(move || {
                use std::io::{BufRead, BufReader};
                let mut r = BufReader::new(s.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    // The rest of the request's head.
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    if path == "/v2/" {
                        let _ = if at == At::Token {
                            s.write_all(format!("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"{realm}\",service=\"hostile\"\r\nContent-Length: 0\r\n\r\n").as_bytes())
                        } else {
                            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                        };
                        continue;
                    }
                    if at == At::Blob && path.contains("/manifests/") {
                        let m = json!({
                            "schemaVersion": 2,
                            "mediaType": "application/vnd.oci.image.manifest.v1+json",
                            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                       "digest": format!("sha256:{}", "c".repeat(64)), "size": 100},
                            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                        "digest": format!("sha256:{}", "1".repeat(64)), "size": 1000}],
                        })
                        .to_string();
                        let _ = s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nContent-Length: {}\r\n\r\n{m}", m.len()).as_bytes());
                        continue;
                    }
                    let filler = vec![b'x'; 64 * 1024];
                    let (status, chunked, len) = match answer {
                        Answer::Declared(n) => (200, false, n),
                        Answer::Endless => (200, true, SENT_AT_MOST),
                        Answer::EndlessError(st) => (st, true, SENT_AT_MOST),
                    };
                    let mut out = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n{}\r\n",
                        if chunked {
                            "Transfer-Encoding: chunked\r\n".to_owned()
                        } else {
                            format!("Content-Length: {len}\r\n")
                        }
                    )
                    .into_bytes();
                    let mut first = head.clone().into_bytes();
                    let mut sent = 0u64;
                    while sent < len {
                        let piece: &[u8] = if first.is_empty() {
                            &filler[..filler.len().min((len - sent) as usize)]
                        } else {
                            first.truncate((len - sent).min(first.len() as u64) as usize);
                            &first
                        };
                        if chunked {
                            out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                            out.extend_from_slice(piece);
                            out.extend_from_slice(b"\r\n");
                        } else {
                            out.extend_from_slice(piece);
                        }
                        sent += piece.len() as u64;
                        first.clear();
                        if s.write_all(&out).is_err() {
                            return;
                        }
                        out.clear();
                    }
                    if chunked {
                        let _ = s.write_all(b"0\r\n\r\n");
                    }
                    return;
                }
            });
        }
    });
    addr
}

/// A registry on loopback that answers a manifest with 300 MB (declared, then without a
/// declared length and without end), or an error page without end: before, the registry
/// client read every body whole (the 300 MB manifest, and an error's body, which it also
/// quoted in its error). Now a manifest is read at most 4 MiB (a declared length over it is
/// refused before anything is read), an error page at most 64 KiB, and neither is quoted.
#[test]
fn a_registry_answering_a_huge_manifest_or_an_endless_error_page_is_read_with_a_cap() {
    let _one = serial();
    let (_home, w, mut c) = watched();
    let secret = marker("registry-body");
    let cases = [
        (Answer::Declared(300_000_000), "a declared 300 MB manifest"),
        (Answer::Endless, "a manifest without end"),
        (Answer::EndlessError(500), "an error page without end"),
        (Answer::EndlessError(404), "a 404 page without end"),
    ];
    for (answer, what) in cases {
        let host = hostile_registry(
            At::Manifest,
            answer,
            format!("{{\"errors\":[{{\"message\":\"{secret}"),
        );
        let t0 = Instant::now();
        let e = c.call_err(
            "templates/pull",
            json!({"provider": "local", "template": format!("{host}/evil/img:latest")}),
        );
        eprintln!("{what}: {:?}: {e}", t0.elapsed());
        assert!(!e.to_string().contains(&secret), "{what}: quoted: {e}");
        let code = abx_code(&e);
        match answer {
            Answer::EndlessError(404) => assert_eq!(code, "E2005", "{what}: {e}"),
            Answer::EndlessError(_) => {
                assert!(e.to_string().contains("HTTP 500"), "{what}: {e}")
            }
            _ => assert!(e.to_string().contains("over 4194304 bytes"), "{what}: {e}"),
        }
    }
    w.check("a registry answering a 300 MB manifest, one without end, endless error pages");
}

/// The token exchange and a failed blob request, before issue 42's last fix read whole by the
/// registry client: a token server answering 300 MB (declared, then chunked without end),
/// an endless 401 or 500 page, and blob requests answered by an endless 500 or 404 page or
/// 300 MB declared for blobs of 100 and 1000 bytes. Now a token answer is read at most 64 KiB (a
/// declared length over it refused before anything is read), an error page at most 64 KiB
/// and never quoted, a blob never past its declared size; each is refused quickly, the
/// daemon's peak under the bound.
#[test]
fn a_token_server_or_a_blob_answering_without_end_is_read_with_a_cap() {
    let _one = serial();
    let (_home, w, mut c) = watched();
    let secret = marker("registry-token");
    let cases = [
        (
            At::Token,
            Answer::Declared(300_000_000),
            "a declared 300 MB token answer",
        ),
        (At::Token, Answer::Endless, "a token answer without end"),
        (
            At::Token,
            Answer::EndlessError(401),
            "a 401 token page without end",
        ),
        (
            At::Token,
            Answer::EndlessError(500),
            "a 500 token page without end",
        ),
        (
            At::Blob,
            Answer::EndlessError(500),
            "a blob's 500 page without end",
        ),
        (
            At::Blob,
            Answer::EndlessError(404),
            "a blob's 404 page without end",
        ),
        (
            At::Blob,
            Answer::Declared(300_000_000),
            "blobs of 100 and 1000 bytes declaring 300 MB",
        ),
    ];
    for (at, answer, what) in cases {
        let host = hostile_registry(at, answer, format!("{{\"token\":\"{secret}"));
        let t0 = Instant::now();
        let e = c.call_err(
            "templates/pull",
            json!({"provider": "local", "template": format!("{host}/evil/img:latest")}),
        );
        let took = t0.elapsed();
        eprintln!("{what}: {took:?}: {e}");
        assert!(!e.to_string().contains(&secret), "{what}: quoted: {e}");
        // 300 MB took the registry client 12 s to read (and the 1 GiB of an endless one
        // the daemon's memory); a capped read takes milliseconds, even on a loaded machine.
        assert!(took < Duration::from_secs(10), "{what}: {took:?}");
        let text = e.to_string();
        match (at, answer) {
            (At::Token, Answer::EndlessError(401)) => {
                assert_eq!(abx_code(&e), "E8010", "{what}: {e}");
                assert_eq!(e["data"]["auth"], "required", "{what}: {e}");
            }
            (At::Token, Answer::EndlessError(n)) => {
                assert!(text.contains(&format!("HTTP {n}")), "{what}: {e}")
            }
            (At::Token, _) => assert!(text.contains("over 65536 bytes"), "{what}: {e}"),
            (_, Answer::EndlessError(404)) => assert_eq!(abx_code(&e), "E2005", "{what}: {e}"),
            (_, Answer::EndlessError(n)) => {
                assert_eq!(abx_code(&e), "E8010", "{what}: {e}");
                assert!(text.contains(&format!("HTTP {n}")), "{what}: {e}")
            }
            _ => assert!(
                text.contains("is longer than the") && text.contains("bytes its manifest declares"),
                "{what}: {e}"
            ),
        }
    }
    w.check("token servers and blob requests answering 300 MB or without end");
}

/// What a request to a [`serve`]d host asked: its path and its `Authorization` header.
struct Asked {
    path: String,
    authz: Option<String>,
}

/// A plain HTTP/1.1 server on `ip` (keep-alive, GETs only) answering each request as
/// `answer` says: (status line, extra headers, body). Every request is kept in the returned
/// list. Returns its `host:port` too.
#[allow(clippy::type_complexity)]
fn serve(
    ip: &str,
    answer: impl Fn(&Asked) -> (String, String, Vec<u8>) + Send + Sync + 'static,
) -> (String, Arc<std::sync::Mutex<Vec<Asked>>>) {
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (answer, seen2) = (Arc::new(answer), seen.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { return };
            let (answer, seen) = (answer.clone(), seen2.clone());
            std::thread::spawn(move || {
                use std::io::{BufRead, BufReader};
                let mut r = BufReader::new(s.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let mut authz = None;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.eq_ignore_ascii_case("authorization") {
                                authz = Some(v.trim().to_owned());
                            }
                        }
                    }
                    let asked = Asked { path, authz };
                    let (status, headers, body) = answer(&asked);
                    seen.lock().unwrap().push(asked);
                    let mut out = format!(
                        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    out.extend_from_slice(&body);
                    if s.write_all(&out).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// The token flow as Docker Hub has it, by three loopback hosts: the registry
/// (`127.0.0.1`) names a token realm on another host (`127.0.0.2`), which takes the docker
/// config's credentials as Basic and answers `{"access_token": ...}` (OAuth2's name; the
/// distribution spec's `token` is covered by `templates.rs` with Debian's registry); blob
/// requests are redirected to a third host (`127.0.0.3`, a CDN) with the token only at the
/// registry. The image is pulled; the CDN never sees the token, the token server never sees a
/// token, and neither the password nor the token is in the daemon's log or its replies.
#[test]
fn a_token_realm_on_another_host_and_blobs_redirected_to_a_cdn_still_pull() {
    let _one = serial();
    let layout = tempfile::tempdir().unwrap();
    let tar_bytes = tar(&[E::File(
        "hello.txt".into(),
        b"hello from the cdn\n".to_vec(),
        0o644,
    )]);
    oci_layout(layout.path(), "v1", &[(tar_bytes, "gzip")], &[], "/");
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.path().join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let blobs = layout.path().join("blobs/sha256");
    let blob = move |digest: &str| std::fs::read(blobs.join(digest.trim_start_matches("sha256:")));

    let password = marker("registry-password");
    let token = marker("registry-token");
    let user = "abx-user";
    let basic = format!(
        "Basic {}",
        abx_protocol::b64::encode(format!("{user}:{password}").as_bytes())
    );
    let want_token = token.clone();
    let (auth_host, auth_seen) = serve("127.0.0.2", move |a| {
        if a.authz.as_deref() != Some(basic.as_str()) {
            return ("401 Unauthorized".into(), String::new(), b"{}".to_vec());
        }
        (
            "200 OK".into(),
            "Content-Type: application/json\r\n".into(),
            json!({"access_token": want_token, "expires_in": 300})
                .to_string()
                .into_bytes(),
        )
    });
    let cdn_blob = blob.clone();
    let (cdn_host, cdn_seen) = serve("127.0.0.3", move |a| {
        match cdn_blob(a.path.trim_start_matches("/blobs/")) {
            Ok(b) => ("200 OK".into(), String::new(), b),
            Err(_) => ("404 Not Found".into(), String::new(), Vec::new()),
        }
    });
    let bearer = format!("Bearer {token}");
    let realm = format!("http://{auth_host}/token");
    let manifest_path = format!("/v2/test/img/manifests/{manifest_digest}");
    let (reg_host, reg_seen) = serve("127.0.0.1", move |a| {
        if a.path == "/v2/" || a.authz.as_deref() != Some(bearer.as_str()) {
            return (
                "401 Unauthorized".into(),
                format!("WWW-Authenticate: Bearer realm=\"{realm}\",service=\"abx-test\"\r\n"),
                b"{}".to_vec(),
            );
        }
        if a.path == "/v2/test/img/manifests/v1" || a.path == manifest_path {
            return (
                "200 OK".into(),
                "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n".into(),
                blob(&manifest_digest).unwrap(),
            );
        }
        if let Some(d) = a.path.strip_prefix("/v2/test/img/blobs/") {
            return (
                "307 Temporary Redirect".into(),
                format!("Location: http://{cdn_host}/blobs/{d}\r\n"),
                Vec::new(),
            );
        }
        ("404 Not Found".into(), String::new(), Vec::new())
    });

    let cfg = tempfile::tempdir().unwrap();
    std::fs::write(
        cfg.path().join("config.json"),
        json!({"auths": {reg_host.clone(): {"auth": abx_protocol::b64::encode(format!("{user}:{password}").as_bytes())}}})
            .to_string(),
    )
    .unwrap();
    let mut home = Home::new();
    home.env
        .push(("DOCKER_CONFIG".into(), cfg.path().display().to_string()));
    home.env.push(("ABX_LOG".into(), "debug".into()));
    home.start();
    let mut c = home.connect();
    c.stream.set_read_timeout(Some(LONG)).unwrap();
    let image = format!("{reg_host}/test/img:v1");
    let got = c.call(
        "templates/pull",
        json!({"provider": "local", "template": image}),
    );
    let listed = c.call("templates/list", json!({"provider": "local"}));
    assert!(listed.to_string().contains(&image), "{got} / {listed}");

    let auth = auth_seen.lock().unwrap();
    assert!(
        auth.iter().any(|a| a.path.starts_with("/token?")
            && a.path.contains("scope=repository%3Atest%2Fimg%3Apull")
            && a.path.contains("service=abx-test")),
        "a pull token was asked for the repository: {:?}",
        auth.iter().map(|a| &a.path).collect::<Vec<_>>()
    );
    assert!(
        auth.iter()
            .all(|a| !a.authz.as_deref().unwrap_or("").starts_with("Bearer")),
        "the token server saw a token"
    );
    let cdn = cdn_seen.lock().unwrap();
    assert!(cdn.len() >= 2, "the config and the layer came from the CDN");
    assert!(
        cdn.iter().all(|a| a.authz.is_none()),
        "the CDN was sent an Authorization"
    );
    assert!(
        reg_seen
            .lock()
            .unwrap()
            .iter()
            .all(|a| a.authz.as_deref().is_none_or(|v| v.starts_with("Bearer "))),
        "the credentials went to the token server only, never to the registry"
    );
    drop(c);
    let log = std::fs::read_to_string(home.log_file()).unwrap();
    for (what, s) in [("password", &password), ("token", &token)] {
        assert!(!log.contains(s.as_str()), "the {what} in the daemon's log");
        assert!(!got.to_string().contains(s.as_str()) && !listed.to_string().contains(s.as_str()));
    }
}
