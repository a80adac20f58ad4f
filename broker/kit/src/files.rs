//! Tests of files: round trips, binary and unicode data, directories, typed errors, large
//! files in chunks, upload/download, watches.

use super::client::{decode, short, Client};
use super::{ensure, pass, Outcome, Sb, T};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const CHUNK: usize = 4 * 1024 * 1024;

fn b64(b: &[u8]) -> String {
    abx_protocol::b64::encode(b)
}

/// Deterministic bytes that do not compress or repeat (xorshift).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

async fn read_text(c: &Client, sb: &Sb, path: &str) -> Result<String, String> {
    let r = c
        .ok("files/read", json!({"sandbox": sb.id, "path": path}))
        .await?;
    Ok(String::from_utf8_lossy(&decode(&r["data"], &r["encoding"])).into_owned())
}

fn entries(l: &Value) -> Vec<Value> {
    l["entries"].as_array().cloned().unwrap_or_default()
}

fn has_entry(l: &Value, path: &str, kind: &str) -> bool {
    entries(l)
        .iter()
        .any(|e| e["path"] == path && e["type"] == kind)
}

pub async fn roundtrip(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let p = "/workspace/kit-hello.txt";
    let w = c
        .ok(
            "files/write",
            json!({"sandbox": sb.id, "path": p, "data": "hello, kit\n"}),
        )
        .await?;
    ensure!(
        w["size"] == 11,
        "files/write of 11 bytes answered size {}",
        w["size"]
    );
    let r = c
        .ok("files/read", json!({"sandbox": sb.id, "path": p}))
        .await?;
    ensure!(
        r["data"] == "hello, kit\n",
        "files/read answered data {}",
        r["data"]
    );
    ensure!(
        r["encoding"] == "utf-8",
        "files/read of text answered encoding {}, expected \"utf-8\"",
        r["encoding"]
    );
    ensure!(
        r["size"] == 11 && r["eof"] == true,
        "files/read answered size {} eof {}, expected 11 and true",
        r["size"],
        r["eof"]
    );
    let st = c
        .ok("files/stat", json!({"sandbox": sb.id, "path": p}))
        .await?;
    ensure!(
        st["type"] == "file"
            && st["size"] == 11
            && st["path"] == p
            && st["name"] == "kit-hello.txt",
        "files/stat answered {}",
        short(&st.to_string())
    );
    let l = c
        .ok(
            "files/list",
            json!({"sandbox": sb.id, "path": "/workspace"}),
        )
        .await?;
    ensure!(
        has_entry(&l, p, "file"),
        "files/list of /workspace does not show {p}: {}",
        short(&l.to_string())
    );
    // Whole-file writes replace; append appends; offsets write in place.
    c.ok(
        "files/write",
        json!({"sandbox": sb.id, "path": p, "data": "bye\n"}),
    )
    .await?;
    let s = read_text(&c, &sb, p).await?;
    ensure!(
        s == "bye\n",
        "after rewriting with \"bye\\n\" the file holds {s:?}: a whole-file write must replace it"
    );
    c.ok(
        "files/write",
        json!({"sandbox": sb.id, "path": p, "data": "more\n", "append": true}),
    )
    .await?;
    let s = read_text(&c, &sb, p).await?;
    ensure!(
        s == "bye\nmore\n",
        "after appending \"more\\n\" the file holds {s:?}"
    );
    c.ok(
        "files/write",
        json!({"sandbox": sb.id, "path": p, "data": "BY", "offset": 0}),
    )
    .await?;
    let s = read_text(&c, &sb, p).await?;
    ensure!(
        s == "BYe\nmore\n",
        "after writing \"BY\" at offset 0 the file holds {s:?}: offset writes must not truncate"
    );
    let s = read_text(&c, &sb, "kit-hello.txt").await?;
    ensure!(
        s == "BYe\nmore\n",
        "a relative path must be under /workspace; reading kit-hello.txt gave {s:?}"
    );
    c.ok(
        "files/write",
        json!({"sandbox": sb.id, "path": "/tmp/kit-tmp.txt", "data": "in tmp"}),
    )
    .await?;
    let s = read_text(&c, &sb, "/tmp/kit-tmp.txt").await?;
    ensure!(s == "in tmp", "/tmp/kit-tmp.txt holds {s:?}");
    if t.has("exec.run") {
        let r = c
            .ok(
                "exec/run",
                json!({"sandbox": sb.id, "command": "cat kit-hello.txt"}),
            )
            .await?;
        let out = String::from_utf8_lossy(&decode(&r["stdout"], &r["encoding"])).into_owned();
        ensure!(
            out == "BYe\nmore\n",
            "a command sees {out:?} in the file files/write wrote: \
             files and commands must share /workspace"
        );
        c.ok(
            "exec/run",
            json!({"sandbox": sb.id, "command": "printf made-by-exec > kit-from-exec.txt"}),
        )
        .await?;
        let s = read_text(&c, &sb, "/workspace/kit-from-exec.txt").await?;
        ensure!(
            s == "made-by-exec",
            "files/read of a file a command wrote answered {s:?}"
        );
    }
    pass()
}

pub async fn binary_and_unicode(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let p = "/workspace/kit-bin.dat";
    let w = c
        .ok(
            "files/write",
            json!({"sandbox": sb.id, "path": p, "data": b64(&bytes), "encoding": "base64"}),
        )
        .await?;
    ensure!(
        w["size"] == bytes.len(),
        "files/write of {} bytes (base64) answered size {}",
        bytes.len(),
        w["size"]
    );
    let r = c
        .ok(
            "files/read",
            json!({"sandbox": sb.id, "path": p, "encoding": "base64"}),
        )
        .await?;
    ensure!(
        r["encoding"] == "base64",
        "files/read with encoding base64 answered encoding {}",
        r["encoding"]
    );
    ensure!(
        decode(&r["data"], &r["encoding"]) == bytes,
        "every byte value written came back changed"
    );
    let r = c
        .ok("files/read", json!({"sandbox": sb.id, "path": p}))
        .await?;
    ensure!(
        r["encoding"] == "base64",
        "files/read of bytes that are not UTF-8, without an encoding, must answer base64; answered {}",
        r["encoding"]
    );
    ensure!(
        decode(&r["data"], &r["encoding"]) == bytes,
        "binary data read without an encoding came back changed"
    );
    c.expect_code(
        "files/read",
        json!({"sandbox": sb.id, "path": p, "encoding": "utf-8"}),
        &["E4007"],
        "files/read of binary data as utf-8",
    )
    .await?;
    c.expect_code(
        "files/write",
        json!({"sandbox": sb.id, "path": p, "data": "not base64!", "encoding": "base64"}),
        &["E4007"],
        "files/write of invalid base64",
    )
    .await?;
    let up = "/workspace/ünï-文件 🌍.txt";
    let text = "héllo wörld 你好 🌍\n";
    let w = c
        .ok(
            "files/write",
            json!({"sandbox": sb.id, "path": up, "data": text}),
        )
        .await?;
    ensure!(
        w["size"] == text.len(),
        "files/write of {} bytes of UTF-8 answered size {}",
        text.len(),
        w["size"]
    );
    let r = c
        .ok("files/read", json!({"sandbox": sb.id, "path": up}))
        .await?;
    ensure!(
        r["data"] == text && r["encoding"] == "utf-8",
        "unicode text came back as {} ({})",
        r["data"],
        r["encoding"]
    );
    // A chunk that would end inside a character: either shortened to whole characters
    // (docs/epp-1.md §6.5) or sent as base64, byte-exact. Never a replacement character.
    c.ok(
        "files/write",
        json!({"sandbox": sb.id, "path": "kit-ee.txt", "data": "éé"}),
    )
    .await?;
    let r = c
        .ok(
            "files/read",
            json!({"sandbox": sb.id, "path": "kit-ee.txt", "offset": 0, "length": 3}),
        )
        .await?;
    let got = decode(&r["data"], &r["encoding"]);
    let whole = r["encoding"] == "utf-8" && got == "é".as_bytes();
    let exact = r["encoding"] == "base64" && got == "éé".as_bytes()[..3];
    ensure!(
        (whole || exact) && r["eof"] == false,
        "reading 3 bytes of \"éé\" must give \"é\" as text or the 3 bytes as base64, eof false; got {} {:?} eof {}",
        r["encoding"],
        got,
        r["eof"]
    );
    pass()
}

pub async fn directory_operations(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let s = sb.id.as_str();
    c.ok(
        "files/mkdir",
        json!({"sandbox": s, "path": "/workspace/kd/sub", "parents": true}),
    )
    .await?;
    c.expect_code(
        "files/mkdir",
        json!({"sandbox": s, "path": "/workspace/kd"}),
        &["E4006"],
        "files/mkdir of an existing directory",
    )
    .await?;
    c.ok(
        "files/mkdir",
        json!({"sandbox": s, "path": "/workspace/kd", "parents": true}),
    )
    .await
    .map_err(|e| format!("{e} (with parents, an existing directory is fine)"))?;
    c.ok(
        "files/write",
        json!({"sandbox": s, "path": "/workspace/kd/sub/f.txt", "data": "x"}),
    )
    .await?;
    let l = c
        .ok("files/list", json!({"sandbox": s, "path": "/workspace/kd"}))
        .await?;
    ensure!(
        has_entry(&l, "/workspace/kd/sub", "directory"),
        "files/list of /workspace/kd does not show sub/ as a directory: {}",
        short(&l.to_string())
    );
    ensure!(
        !has_entry(&l, "/workspace/kd/sub/f.txt", "file"),
        "files/list without recursive shows the contents of subdirectories"
    );
    let l = c
        .ok(
            "files/list",
            json!({"sandbox": s, "path": "/workspace/kd", "recursive": true}),
        )
        .await?;
    ensure!(
        has_entry(&l, "/workspace/kd/sub", "directory")
            && has_entry(&l, "/workspace/kd/sub/f.txt", "file"),
        "files/list recursive of /workspace/kd answered {}",
        short(&l.to_string())
    );
    c.ok(
        "files/rename",
        json!({"sandbox": s, "from": "/workspace/kd/sub/f.txt", "to": "/workspace/kd/g.txt"}),
    )
    .await?;
    c.expect_code(
        "files/stat",
        json!({"sandbox": s, "path": "/workspace/kd/sub/f.txt"}),
        &["E4001"],
        "files/stat of a renamed file's old path",
    )
    .await?;
    let st = c
        .ok(
            "files/stat",
            json!({"sandbox": s, "path": "/workspace/kd/g.txt"}),
        )
        .await?;
    ensure!(
        st["type"] == "file" && st["size"] == 1,
        "files/stat of the renamed file answered {}",
        short(&st.to_string())
    );
    c.expect_code(
        "files/remove",
        json!({"sandbox": s, "path": "/workspace/kd"}),
        &["E4005"],
        "files/remove of a non-empty directory without recursive",
    )
    .await?;
    c.expect_code(
        "files/read",
        json!({"sandbox": s, "path": "/workspace/kd"}),
        &["E4003"],
        "files/read of a directory",
    )
    .await?;
    c.ok(
        "files/remove",
        json!({"sandbox": s, "path": "/workspace/kd", "recursive": true}),
    )
    .await?;
    c.expect_code(
        "files/stat",
        json!({"sandbox": s, "path": "/workspace/kd"}),
        &["E4001"],
        "files/stat of a removed directory",
    )
    .await?;
    // Beyond the sandbox's root (a path of its own root, `/etc/passwd`, is the sandbox's:
    // readable where the provider serves its whole view, issue 43).
    for outside in [
        "/workspace/../../etc/passwd",
        "/workspace/../../../../../etc/passwd",
        "../../etc/passwd",
    ] {
        c.expect_code(
            "files/read",
            json!({"sandbox": s, "path": outside}),
            &["E4002"],
            &format!("files/read of {outside:?}"),
        )
        .await?;
    }
    pass()
}

pub async fn missing_file_is_a_typed_not_found(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let s = sb.id.as_str();
    c.expect_code(
        "files/read",
        json!({"sandbox": s, "path": "/workspace/kit-nope.txt"}),
        &["E4001"],
        "files/read of a missing file",
    )
    .await?;
    c.expect_code(
        "files/stat",
        json!({"sandbox": s, "path": "/workspace/kit-nope.txt"}),
        &["E4001"],
        "files/stat of a missing file",
    )
    .await?;
    c.expect_code(
        "files/list",
        json!({"sandbox": s, "path": "/workspace/kit-nope-dir"}),
        &["E4001"],
        "files/list of a missing directory",
    )
    .await?;
    c.expect_code(
        "files/write",
        json!({"sandbox": s, "path": "/workspace/kit-nope-dir/f.txt", "data": "x"}),
        &["E4001"],
        "files/write into a missing directory",
    )
    .await?;
    let e = c
        .expect_code(
            "files/read",
            json!({"sandbox": s, "path": "/workspace/kit-nope.txt"}),
            &["E4001"],
            "files/read of a missing file",
        )
        .await?;
    ensure!(
        e.code == 4001,
        "E4001 must travel as error code 4001, not {}",
        e.code
    );
    pass()
}

pub async fn large_file_in_chunks(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let p = "/workspace/kit-large.bin";
    let data = noise(3 * CHUNK, 0x5eed);
    for (i, chunk) in data.chunks(CHUNK).enumerate() {
        let mut params =
            json!({"sandbox": sb.id, "path": p, "data": b64(chunk), "encoding": "base64"});
        if i > 0 {
            params["offset"] = json!(i * CHUNK);
        }
        let w = c.ok("files/write", params).await?;
        ensure!(
            w["size"] == (i + 1) * CHUNK,
            "after writing chunk {} at offset {} the file size is {}, expected {}",
            i + 1,
            i * CHUNK,
            w["size"],
            (i + 1) * CHUNK
        );
    }
    let st = c
        .ok("files/stat", json!({"sandbox": sb.id, "path": p}))
        .await?;
    ensure!(
        st["size"] == data.len(),
        "files/stat of the 12 MiB file answered size {}",
        st["size"]
    );
    let mut back = Vec::with_capacity(data.len());
    let mut reads = 0;
    loop {
        let r = c
            .ok(
                "files/read",
                json!({
                    "sandbox": sb.id, "path": p, "offset": back.len(),
                    "length": CHUNK, "encoding": "base64",
                }),
            )
            .await?;
        reads += 1;
        ensure!(
            r["size"] == data.len(),
            "files/read answered size {} for the whole file, expected {}",
            r["size"],
            data.len()
        );
        let got = decode(&r["data"], &r["encoding"]);
        ensure!(
            got.len() <= CHUNK,
            "files/read with length 4 MiB answered {} bytes",
            got.len()
        );
        back.extend_from_slice(&got);
        let eof = r["eof"] == true;
        ensure!(
            eof == (back.len() == data.len()),
            "files/read at {} answered eof {eof} after {} of {} bytes",
            back.len() - got.len(),
            back.len(),
            data.len()
        );
        if eof {
            break;
        }
        ensure!(
            !got.is_empty() && reads < 16,
            "files/read makes no progress at offset {}",
            back.len()
        );
    }
    if back != data {
        let at = back
            .iter()
            .zip(&data)
            .position(|(a, b)| a != b)
            .unwrap_or(back.len().min(data.len()));
        return Err(format!(
            "the 12 MiB file came back different from byte {at}"
        ));
    }
    pass()
}

/// A local file that is removed when dropped.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_path(tag: &str) -> TempFile {
    let mut r = [0u8; 8];
    let _ = getrandom(&mut r);
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    TempFile(std::env::temp_dir().join(format!("abx-kit-{}-{tag}-{hex}", std::process::id())))
}

fn getrandom(buf: &mut [u8]) -> bool {
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    n as usize == buf.len()
}

pub async fn upload_download(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let data = noise(CHUNK + 1234, 0xfeed);
    let up = temp_path("up");
    std::fs::write(&up.0, &data)
        .map_err(|e| format!("cannot write the local file {}: {e}", up.0.display()))?;
    let p = "/workspace/kit-up.bin";
    let r = c
        .ok(
            "files/upload",
            json!({"sandbox": sb.id, "localPath": up.0, "path": p}),
        )
        .await?;
    ensure!(
        r["size"] == data.len(),
        "files/upload of {} bytes answered size {}",
        data.len(),
        r["size"]
    );
    let st = c
        .ok("files/stat", json!({"sandbox": sb.id, "path": p}))
        .await?;
    ensure!(
        st["size"] == data.len(),
        "after files/upload, files/stat answers size {}",
        st["size"]
    );
    let down = temp_path("down");
    let r = c
        .ok(
            "files/download",
            json!({"sandbox": sb.id, "localPath": down.0, "path": p}),
        )
        .await?;
    ensure!(
        r["size"] == data.len(),
        "files/download of {} bytes answered size {}",
        data.len(),
        r["size"]
    );
    let back =
        std::fs::read(&down.0).map_err(|e| format!("cannot read the downloaded file: {e}"))?;
    ensure!(
        back == data,
        "the file came back different after upload and download ({} of {} bytes)",
        back.len(),
        data.len()
    );
    let how = if t.has("files.transfer") {
        "native transfer"
    } else {
        "chunked files/read and files/write"
    };
    Ok(super::Done::Passed(Some(format!("through {how}"))))
}

pub async fn watch(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let r = c
        .ok(
            "files/watch",
            json!({"sandbox": sb.id, "path": "/workspace", "recursive": true}),
        )
        .await?;
    let wid = r["watchId"]
        .as_str()
        .ok_or_else(|| format!("files/watch answered no watchId: {r}"))?
        .to_owned();
    let mut s = c.stream(&wid);
    let p = "/workspace/kit-watched.txt";
    c.ok(
        "files/write",
        json!({"sandbox": sb.id, "path": p, "data": "x"}),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(n) = s.next(left).await else {
            return Err(format!(
                "no files/changed for {p} within 5 s (got {seen:?})"
            ));
        };
        if n.method != "files/changed" {
            continue;
        }
        ensure!(
            n.params["watchId"] == wid.as_str(),
            "files/changed carries watchId {}",
            n.params["watchId"]
        );
        let path = n.params["path"].as_str().unwrap_or_default().to_owned();
        let kind = n.params["kind"].as_str().unwrap_or_default().to_owned();
        ensure!(
            ["created", "modified", "removed", "renamed"].contains(&kind.as_str()),
            "files/changed has kind {kind:?}"
        );
        if path == p {
            break;
        }
        seen.push(path);
    }
    c.ok("files/unwatch", json!({"watchId": wid})).await?;
    // Let what was in flight arrive, then nothing more may come for a new file.
    tokio::time::sleep(Duration::from_millis(50)).await;
    while s.next(Duration::ZERO).await.is_some() {}
    let p2 = "/workspace/kit-after-unwatch.txt";
    c.ok(
        "files/write",
        json!({"sandbox": sb.id, "path": p2, "data": "y"}),
    )
    .await?;
    let until = Instant::now() + Duration::from_millis(200);
    while let Some(n) = s
        .next(until.saturating_duration_since(Instant::now()))
        .await
    {
        ensure!(
            n.params["path"] != p2,
            "files/changed for {p2} arrived after files/unwatch"
        );
    }
    pass()
}
