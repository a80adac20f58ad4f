//! Small shared helpers.

use std::io::Write;
use std::path::Path;

/// Write a file atomically: a temp file in the same directory, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_via_rename(path, bytes, true)
}

/// [`write_atomic`] without the fsync: atomic against a crash of the daemon (old or new
/// content, never a mix), not durable across a power loss. For records that are worth
/// nothing after one (a sandbox's processes do not survive it either) and sit on the hot path
/// of `sandbox/create` (an fsync costs milliseconds on these disks).
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_via_rename(path, bytes, false)
}

fn write_via_rename(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("f"),
        std::process::id()
    ));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
    }
    std::fs::rename(&tmp, path)
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// RFC 3339 UTC with seconds, from unix seconds.
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// RFC 3339 UTC with the fraction of a second the clock had (nanoseconds, trailing zeros
/// left out; none when `nanos` is 0): `2026-12-01T14:38:20.123456789Z`.
pub fn rfc3339_nanos(secs: i64, nanos: i64) -> String {
    let nanos = nanos.clamp(0, 999_999_999);
    let whole = rfc3339(secs);
    if nanos == 0 {
        return whole;
    }
    let frac = format!("{nanos:09}");
    format!(
        "{}.{}Z",
        whole.trim_end_matches('Z'),
        frac.trim_end_matches('0')
    )
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    // Howard Hinnant's algorithm.
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_795_971_600), "2026-11-29T17:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(4_107_587_696), "2100-03-01T12:34:56Z");
        assert_eq!(super::rfc3339(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn rfc3339_nanos() {
        assert_eq!(super::rfc3339_nanos(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339_nanos(0, 5), "1970-01-01T00:00:00.000000005Z");
        assert_eq!(
            super::rfc3339_nanos(0, 120_000_000),
            "1970-01-01T00:00:00.12Z"
        );
        assert_eq!(
            super::rfc3339_nanos(1_795_971_600, 123_456_789),
            "2026-11-29T17:00:00.123456789Z"
        );
    }
}
