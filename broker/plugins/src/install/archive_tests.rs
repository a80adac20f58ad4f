//! Unit tests of archive sources: a loopback HTTP server, pinning by sha256, hostile
//! archives (escapes, links, special files) refused with nothing kept.

use super::tests::{assert_clean, env, plugin_dir, refused_code, req};
use super::*;
use std::net::TcpListener;
use std::os::unix::fs::symlink;

/// Serve `body` once per connection on a loopback port; returns the base URL.
fn serve(body: Vec<u8>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut buf = [0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&got);
            let resp = if head.starts_with("GET /missing") {
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
            } else {
                let mut r = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/gzip\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                r.extend_from_slice(&body);
                r
            };
            let _ = s.write_all(&resp);
        }
    });
    format!("http://{addr}")
}

/// A .tar.gz of `dir`'s contents under a top-level `name/`, made with the system tar.
fn targz(dir: &Path, name: &str, extra: &[&str]) -> Vec<u8> {
    let out = dir.with_extension("tar.gz");
    let st = Command::new("tar")
        .arg("-czf")
        .arg(&out)
        .args(extra)
        .arg("-C")
        .arg(dir.parent().unwrap())
        .arg("--transform")
        .arg(format!(
            "s,^{},{name},",
            dir.file_name().unwrap().to_str().unwrap()
        ))
        .arg(dir.file_name().unwrap())
        .status()
        .unwrap();
    assert!(st.success());
    fs::read(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_over_loopback_http() {
    let env = env();
    let src = env.base.join("arch");
    plugin_dir(&src, "archived");
    let d = digest::dirhash(&src).unwrap();
    let base = serve(targz(&src, "archived-1.0", &[]));
    let url = format!("{base}/releases/archived-1.0.tar.gz");

    // Without --sha256: refused, with the command to re-run.
    let mut r = req(&url);
    r.allow_insecure_transport = true;
    r.confirm = true;
    let e = install(&env.data, &r).await.unwrap_err();
    refused_code(&e);
    assert!(e.message.contains("without --sha256"), "{}", e.message);
    assert!(
        e.suggestion.ends_with(&format!(
            "abx provider install {url} --sha256 '<digest>' --allow-insecure-transport --yes"
        )),
        "{}",
        e.suggestion
    );
    // http:// without --allow-insecure-transport: refused.
    let mut r2 = r.clone();
    r2.allow_insecure_transport = false;
    r2.sha256 = Some(d.clone());
    let e = install(&env.data, &r2).await.unwrap_err();
    refused_code(&e);
    assert!(
        e.suggestion.contains("--sha256 sha256:")
            && e.suggestion.contains("--allow-insecure-transport --yes")
    );
    // A dry run shows the digest; a wrong one is E8013; the right one installs.
    let mut dry = r.clone();
    dry.dry_run = true;
    dry.confirm = false;
    let plan = install(&env.data, &dry).await.unwrap();
    assert_eq!(plan.digest, d);
    let mut wrong = r.clone();
    wrong.sha256 = Some(format!("sha256:{}", "1".repeat(64)));
    assert_eq!(
        install(&env.data, &wrong).await.unwrap_err().code,
        ErrorCode::DigestMismatch
    );
    r.sha256 = Some(d.clone());
    let plan = install(&env.data, &r).await.unwrap();
    assert_eq!(plan.trust, Trust::Pinned);
    assert_eq!(plan.id, "archived");
    digest::verify(plan.path.as_ref().unwrap(), &d, "archived").unwrap();
    assert_clean(&env.data);

    // 404.
    let mut r404 = r.clone();
    r404.source = format!("{base}/missing.tgz");
    let e = install(&env.data, &r404).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::SourceUnreachable);
    assert!(e.message.contains("404"), "{}", e.message);
    assert_clean(&env.data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_archives_are_refused() {
    let env = env();
    let outside = env.base.join("escaped.txt");
    for (case, extra, what) in [
        ("symlink", &[][..], "symlink"),
        (
            "dotdot",
            &[
                "-P",
                "--transform",
                "s,^dotdot/lib/util.sh,../../escaped.txt,",
            ][..],
            "outside its root",
        ),
        (
            "absolute",
            &[
                "-P",
                "--transform",
                "s,^absolute/lib/util.sh,/tmp/abx-escaped.txt,",
            ][..],
            "outside its root",
        ),
    ] {
        let src = env.base.join(case);
        plugin_dir(&src, "bad");
        if case == "symlink" {
            symlink("/etc/passwd", src.join("lib/passwd")).unwrap();
        }
        let out = src.with_extension("tar.gz");
        let st = Command::new("tar")
            .arg("-czf")
            .arg(&out)
            .args(extra)
            .arg("-C")
            .arg(&env.base)
            .arg(case)
            .status()
            .unwrap();
        assert!(st.success());
        let base = serve(fs::read(&out).unwrap());
        let r = Request {
            source: format!("{base}/p.tar.gz"),
            sha256: Some(format!("sha256:{}", "0".repeat(64))),
            allow_insecure_transport: true,
            confirm: true,
            ..Request::default()
        };
        let e = install(&env.data, &r).await.unwrap_err();
        refused_code(&e);
        assert!(e.message.contains(what), "{case}: {}", e.message);
        assert!(!outside.exists());
        assert!(!Path::new("/tmp/abx-escaped.txt").exists());
        assert_clean(&env.data);
    }
    // Not an archive at all.
    let base = serve(b"<html>hello</html>".to_vec());
    let r = Request {
        source: format!("{base}/p.tgz"),
        sha256: Some(format!("sha256:{}", "0".repeat(64))),
        allow_insecure_transport: true,
        confirm: true,
        ..Request::default()
    };
    let e = install(&env.data, &r).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::SourceUnreachable);
    assert!(e.message.contains("not a .tar.gz archive"), "{}", e.message);
    assert_clean(&env.data);
}
