//! A streaming reader of tar archives for untrusted input (image layers, `docker save`
//! archives), and the whiteout grammar of OCI layers.
//!
//! Every 512-byte header is checked (checksum, numeric fields) before anything of its entry
//! is read. The records that describe the next entry (GNU long name `L`, long link `K`, PAX
//! `x`; PAX global `g`, read and ignored) are read only up to [`MAX_EXTENSION`] bytes each:
//! a larger one is refused at its header, before a byte of it is read (the `tar` crate reads
//! them whole into memory, whatever size they declare). Nothing else is buffered: an entry's
//! data is read by the caller through the reader, or skipped. A header's size is the PAX
//! `size` where one is given (as GNU tar and Go's archive/tar read it), and GNU sparse
//! entries (`S`, with their extension blocks) give their map.
//!
//! Errors say where (a byte offset) and what is wrong, with numbers at most, never a byte of
//! the archive: a file that is not a tar (`/etc/shadow` given as one) must not end up quoted
//! in an error or a log.
//!
//! Pure code (std only): the fuzz crate compiles this file as it is (`fuzz/src/lib.rs`).

use std::io::{self, Read};

/// Size of a tar block.
pub const BLOCK: u64 = 512;
/// The largest GNU long name / long link or PAX record read.
pub const MAX_EXTENSION: u64 = 64 * 1024;
/// The most extension records before one entry.
const MAX_EXTENSIONS_IN_A_ROW: usize = 8;
/// The most segments of a sparse file's map.
pub const MAX_SPARSE_SEGMENTS: usize = 65536;

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file (`0`, NUL, `7`, and GNU sparse `S`).
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A hard link.
    HardLink,
    /// Anything else (devices, fifos, GNU dump dirs, volume labels, unknown types).
    Other,
}

/// One entry's header, as the extension records before it complete it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Where its header starts in the stream.
    pub offset: u64,
    /// Its name (long name, else PAX `path`, else the header's, with the ustar prefix).
    pub path: Vec<u8>,
    /// Its link target (long link, else PAX `linkpath`, else the header's).
    pub link: Vec<u8>,
    /// Its type.
    pub kind: Kind,
    /// Its permission bits, where the field is readable.
    pub mode: Option<u32>,
    /// Its size as unpacked: the data's size, or a sparse file's real size.
    pub size: u64,
    /// Bytes of its data in the archive.
    pub stored: u64,
    /// A sparse file's segments (offset, length), in order: its stored data, one after the
    /// other.
    pub sparse: Option<Vec<(u64, u64)>>,
    /// Bytes of the extension records that described it.
    pub extension_bytes: u64,
}

/// A malformed archive: where, and what (words and numbers only).
#[derive(Debug)]
pub struct Malformed {
    /// The byte offset.
    pub at: u64,
    /// What is wrong.
    pub what: String,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "not a valid tar archive at byte {}: {}",
            self.at, self.what
        )
    }
}

impl std::error::Error for Malformed {}

fn malformed(at: u64, what: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        Malformed {
            at,
            what: what.into(),
        },
    )
}

/// The reader: [`Reader::next`] gives each entry's header; reading the reader gives that
/// entry's stored data (a sparse file's segments one after the other).
pub struct Reader<R> {
    inner: R,
    /// Bytes consumed from `inner`.
    pos: u64,
    /// Data of the current entry not read yet.
    left: u64,
    /// Padding after it.
    pad: u64,
    /// Where the current entry's header was (for errors in its data).
    entry_at: u64,
    done: bool,
}

#[derive(Default)]
struct Pax {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

impl<R: Read> Reader<R> {
    /// A reader of the tar stream `inner`.
    pub fn new(inner: R) -> Reader<R> {
        Reader {
            inner,
            pos: 0,
            left: 0,
            pad: 0,
            entry_at: 0,
            done: false,
        }
    }

    /// Bytes of the stream consumed so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Fill `buf` whole: Ok(false) at a clean end (nothing read).
    fn read_exact_or_end(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let mut n = 0;
        while n < buf.len() {
            match self.inner.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.pos += n as u64;
        if n == 0 {
            return Ok(false);
        }
        if n < buf.len() {
            return Err(malformed(self.pos, "the archive ends inside a header"));
        }
        Ok(true)
    }

    /// Read and drop `n` bytes; false when the stream ended first.
    fn discard(&mut self, mut n: u64) -> io::Result<bool> {
        let mut buf = [0u8; 8192];
        while n > 0 {
            let want = n.min(buf.len() as u64) as usize;
            let k = match self.inner.read(&mut buf[..want]) {
                Ok(0) => return Ok(false),
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.pos += k as u64;
            n -= k as u64;
        }
        Ok(true)
    }

    /// Skip what the caller did not read of the current entry, and its padding.
    fn skip_rest(&mut self) -> io::Result<()> {
        if self.left > 0 {
            let left = std::mem::take(&mut self.left);
            if !self.discard(left)? {
                return Err(malformed(self.entry_at, "the archive ends inside an entry"));
            }
        }
        let pad = std::mem::take(&mut self.pad);
        // An archive cut right after its last entry's data is read as complete.
        if !self.discard(pad)? {
            self.done = true;
        }
        Ok(())
    }

    /// An extension record's data (at most [`MAX_EXTENSION`] bytes, checked by the caller).
    fn record(&mut self, at: u64, size: u64) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; size as usize];
        let mut n = 0;
        while n < v.len() {
            match self.inner.read(&mut v[n..]) {
                Ok(0) => return Err(malformed(at, "the archive ends inside an extension record")),
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.pos += size;
        if !self.discard(padding(size))? {
            return Err(malformed(at, "the archive ends inside an extension record"));
        }
        Ok(v)
    }

    /// The next entry's header; None at the end of the archive.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> io::Result<Option<Entry>> {
        if self.done {
            return Ok(None);
        }
        self.skip_rest()?;
        if self.done {
            return Ok(None);
        }
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax: Option<Pax> = None;
        let mut extension_bytes = 0u64;
        let mut records = 0usize;
        loop {
            let at = self.pos;
            let mut h = [0u8; BLOCK as usize];
            let pending = long_name.is_some() || long_link.is_some() || pax.is_some();
            if !self.read_exact_or_end(&mut h)? || h.iter().all(|&b| b == 0) {
                self.done = true;
                if pending {
                    return Err(malformed(at, "extension records with no entry after them"));
                }
                return Ok(None);
            }
            check_sum(&h, at)?;
            let typ = h[156];
            let size = numeric(&h[124..136])
                .ok_or_else(|| malformed(at, "the size field is not a number"))?;
            if matches!(typ, b'L' | b'K' | b'x' | b'g') {
                records += 1;
                if records > MAX_EXTENSIONS_IN_A_ROW {
                    return Err(malformed(
                        at,
                        format!("more than {MAX_EXTENSIONS_IN_A_ROW} extension records in a row"),
                    ));
                }
                if size > MAX_EXTENSION {
                    return Err(malformed(
                        at,
                        format!(
                            "an extension record (GNU long name or link, or PAX) of {size} bytes, over the cap of {MAX_EXTENSION}"
                        ),
                    ));
                }
                extension_bytes += size;
                let data = self.record(at, size)?;
                match typ {
                    b'L' | b'K' => {
                        let slot = if typ == b'L' {
                            &mut long_name
                        } else {
                            &mut long_link
                        };
                        if slot.is_some() {
                            return Err(malformed(at, "two long names for one entry"));
                        }
                        *slot = Some(until_nul(&data).to_vec());
                    }
                    b'x' => {
                        if pax.is_some() {
                            return Err(malformed(at, "two PAX records for one entry"));
                        }
                        pax = Some(parse_pax(&data).map_err(|w| malformed(at, w))?);
                    }
                    // Global PAX records: nothing of them is used.
                    _ => {}
                }
                continue;
            }
            let pax = pax.unwrap_or_default();
            let gnu = &h[257..265] == b"ustar  \0";
            let ustar = &h[257..263] == b"ustar\0";
            let stored = pax.size.unwrap_or(size);
            let kind = match typ {
                b'0' | b'\0' | b'7' => Kind::File,
                b'S' if gnu => Kind::File,
                b'1' => Kind::HardLink,
                b'2' => Kind::Symlink,
                b'5' => Kind::Dir,
                _ => Kind::Other,
            };
            let path = match (long_name, pax.path) {
                (Some(p), _) | (None, Some(p)) => p,
                (None, None) => {
                    let name = until_nul(&h[0..100]);
                    let prefix = if ustar { until_nul(&h[345..500]) } else { &[] };
                    if prefix.is_empty() {
                        name.to_vec()
                    } else {
                        [prefix, b"/", name].concat()
                    }
                }
            };
            let link = match (long_link, pax.link) {
                (Some(l), _) | (None, Some(l)) => l,
                (None, None) => until_nul(&h[157..257]).to_vec(),
            };
            let mode = octal(&h[100..108]).map(|m| (m & 0o7777) as u32);
            let (size, sparse) = if typ == b'S' && gnu {
                let (real, map) = self.sparse_map(&h, at, stored)?;
                (real, Some(map))
            } else {
                (stored, None)
            };
            self.entry_at = at;
            self.left = stored;
            self.pad = padding(stored);
            return Ok(Some(Entry {
                offset: at,
                path,
                link,
                kind,
                mode,
                size,
                stored,
                sparse,
                extension_bytes,
            }));
        }
    }

    /// The map of a GNU sparse entry: its header's four slots and its extension blocks.
    fn sparse_map(
        &mut self,
        h: &[u8; BLOCK as usize],
        at: u64,
        stored: u64,
    ) -> io::Result<(u64, Vec<(u64, u64)>)> {
        let bad = |w: &str| malformed(at, format!("a sparse entry's map: {w}"));
        let real = numeric(&h[483..495]).ok_or_else(|| bad("the real size is not a number"))?;
        let mut map: Vec<(u64, u64)> = Vec::new();
        let mut add = |slot: &[u8]| -> io::Result<()> {
            // An unused slot (as the tar crate reads it).
            if slot[0] == 0 || slot[12] == 0 {
                return Ok(());
            }
            let off = numeric(&slot[..12]).ok_or_else(|| bad("an offset is not a number"))?;
            let len = numeric(&slot[12..24]).ok_or_else(|| bad("a length is not a number"))?;
            if map.len() >= MAX_SPARSE_SEGMENTS {
                return Err(bad("too many segments"));
            }
            map.push((off, len));
            Ok(())
        };
        for i in 0..4 {
            add(&h[386 + i * 24..386 + (i + 1) * 24])?;
        }
        let mut more = h[482] != 0;
        while more {
            let mut b = [0u8; BLOCK as usize];
            if !self.read_exact_or_end(&mut b)? {
                return Err(bad("the archive ends inside it"));
            }
            for i in 0..21 {
                add(&b[i * 24..(i + 1) * 24])?;
            }
            more = b[504] != 0;
        }
        let mut end = 0u64;
        let mut total = 0u64;
        for &(off, len) in &map {
            if off < end {
                return Err(bad("segments out of order or overlapping"));
            }
            end = off
                .checked_add(len)
                .ok_or_else(|| bad("a segment past the largest size"))?;
            total = total
                .checked_add(len)
                .ok_or_else(|| bad("a segment past the largest size"))?;
        }
        if end > real {
            return Err(bad("a segment past the real size"));
        }
        if total != stored {
            return Err(bad("the segments do not add up to the stored data"));
        }
        Ok((real, map))
    }
}

impl<R: Read> Read for Reader<R> {
    /// The current entry's stored data.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                Malformed {
                    at: self.entry_at,
                    what: "the archive ends inside an entry".into(),
                },
            ));
        }
        self.pos += n as u64;
        self.left -= n as u64;
        Ok(n)
    }
}

fn padding(size: u64) -> u64 {
    (BLOCK - size % BLOCK) % BLOCK
}

fn until_nul(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

fn check_sum(h: &[u8; BLOCK as usize], at: u64) -> io::Result<()> {
    let want =
        octal(&h[148..156]).ok_or_else(|| malformed(at, "the checksum field is not a number"))?;
    let got: u64 = h[..148]
        .iter()
        .chain(&h[156..])
        .map(|&b| b as u64)
        .sum::<u64>()
        + 8 * b' ' as u64;
    if want != got {
        return Err(malformed(
            at,
            "header checksum mismatch (not a tar archive?)",
        ));
    }
    Ok(())
}

/// An octal field: digits between optional spaces, ending at a NUL or the field's end.
pub fn octal(f: &[u8]) -> Option<u64> {
    let s = until_nul(f);
    let start = s.iter().position(|&b| b != b' ')?;
    let end = s.iter().rposition(|&b| b != b' ')? + 1;
    let mut n: u64 = 0;
    for &b in &s[start..end] {
        if !(b'0'..=b'7').contains(&b) {
            return None;
        }
        n = n.checked_mul(8)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

/// A numeric field: octal, or GNU base-256 (a first byte of 0x80, then big-endian).
pub fn numeric(f: &[u8]) -> Option<u64> {
    match f.first() {
        Some(0x80) => f[1..]
            .iter()
            .try_fold(0u64, |n, &b| n.checked_mul(256)?.checked_add(u64::from(b))),
        // Negative base-256 numbers, and other high bytes.
        Some(b) if b & 0x80 != 0 => None,
        _ => octal(f),
    }
}

/// The records of a PAX extended header: `path`, `linkpath` and `size` (others ignored).
fn parse_pax(mut data: &[u8]) -> Result<Pax, &'static str> {
    let mut pax = Pax::default();
    while !data.is_empty() && data.iter().any(|&b| b != 0) {
        let sp = data
            .iter()
            .take(20)
            .position(|&b| b == b' ')
            .ok_or("a PAX record without its length")?;
        let len = decimal(&data[..sp]).ok_or("a PAX record's length is not a number")?;
        let len = usize::try_from(len).map_err(|_| "a PAX record longer than its header")?;
        if len <= sp + 1 || len > data.len() {
            return Err("a PAX record longer than its header");
        }
        let rec = data[sp + 1..len]
            .strip_suffix(b"\n")
            .ok_or("a PAX record without its newline")?;
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or("a PAX record without '='")?;
        let (k, v) = (&rec[..eq], &rec[eq + 1..]);
        let value = (!v.is_empty()).then(|| v.to_vec());
        match k {
            b"path" => pax.path = value,
            b"linkpath" => pax.link = value,
            b"size" => {
                pax.size = match value {
                    Some(v) => Some(decimal(&v).ok_or("a PAX size that is not a number")?),
                    None => None,
                }
            }
            _ => {}
        }
        data = &data[len..];
    }
    Ok(pax)
}

fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// What a name of a layer says about whiteouts (OCI image spec, "Whiteouts").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whiteout<'a> {
    /// Not a whiteout: an ordinary name.
    No,
    /// `.wh..wh..opq`: the directory's lower content is hidden.
    Opaque,
    /// `.wh.<name>`: `<name>` of the same directory is removed.
    Remove(&'a [u8]),
    /// Anything else beginning with `.wh.` (`.wh.`, `.wh..`, `.wh...`, `.wh..wh.plnk` and the
    /// other AUFS metadata): never acted on, never made.
    Invalid,
}

/// The whiteout meaning of the last component `name` of an entry of a layer.
pub fn whiteout(name: &[u8]) -> Whiteout<'_> {
    if name == b".wh..wh..opq" {
        return Whiteout::Opaque;
    }
    let Some(rest) = name.strip_prefix(b".wh.") else {
        return Whiteout::No;
    };
    if rest.is_empty()
        || rest == b"."
        || rest == b".."
        || rest.starts_with(b".wh.")
        || rest.contains(&b'/')
        || rest.contains(&0)
    {
        Whiteout::Invalid
    } else {
        Whiteout::Remove(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, typ: u8, size: u64) -> [u8; 512] {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        h[156] = typ;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        h
    }

    fn entry(out: &mut Vec<u8>, name: &str, typ: u8, data: &[u8]) {
        out.extend(header(name, typ, data.len() as u64));
        out.extend(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }

    fn all(b: &[u8]) -> io::Result<Vec<(Entry, Vec<u8>)>> {
        let mut r = Reader::new(b);
        let mut out = Vec::new();
        while let Some(e) = r.next()? {
            let mut d = Vec::new();
            r.read_to_end(&mut d)?;
            out.push((e, d));
        }
        Ok(out)
    }

    #[test]
    fn entries_long_names_and_pax_records_are_read() {
        let mut b = Vec::new();
        entry(&mut b, "a/file", b'0', b"hello");
        let long = format!("{}/x", "d".repeat(300));
        entry(
            &mut b,
            "././@LongLink",
            b'L',
            format!("{long}\0").as_bytes(),
        );
        entry(&mut b, "short", b'0', b"x");
        entry(
            &mut b,
            "PaxHeaders/y",
            b'x',
            b"17 path=pax/name\n18 linkpath=tgt/t\n",
        );
        entry(&mut b, "ignored", b'2', b"");
        // A PAX size over a header size of 0 (as Go writes files over 8 GiB).
        entry(&mut b, "PaxHeaders/z", b'x', b"11 size=13\n");
        b.extend(header("sized", b'0', 0));
        b.extend(b"thirteen byte");
        b.resize(b.len().div_ceil(512) * 512, 0);
        b.extend([0u8; 1024]);
        let e = all(&b).unwrap();
        assert_eq!(e.len(), 4);
        assert_eq!(
            (e[0].0.path.as_slice(), e[0].1.as_slice()),
            (&b"a/file"[..], &b"hello"[..])
        );
        assert_eq!(e[1].0.path, long.as_bytes());
        assert_eq!(e[1].0.extension_bytes, long.len() as u64 + 1);
        assert_eq!(e[2].0.kind, Kind::Symlink);
        assert_eq!(
            (e[2].0.path.as_slice(), e[2].0.link.as_slice()),
            (&b"pax/name"[..], &b"tgt/t"[..])
        );
        assert_eq!(e[3].1, b"thirteen byte");
    }

    #[test]
    fn a_huge_extension_record_is_refused_at_its_header() {
        for typ in [b'L', b'K', b'x', b'g'] {
            // Only the header: nothing of the 3 GB is there, nor read.
            let h = header("././@LongLink", typ, 3_000_000_000);
            let e = all(&h).unwrap_err();
            let m = e.to_string();
            assert!(m.contains("3000000000") && m.contains("65536"), "{m}");
        }
    }

    #[test]
    fn errors_never_quote_the_input() {
        let mut shadow = b"root:$y$j9T$SECRETSECRETSECRET:19700:0:99999:7:::\n".repeat(20);
        shadow.truncate(1024);
        let m = all(&shadow).unwrap_err().to_string();
        assert!(!m.contains("SECRET") && !m.contains("root"), "{m}");
        // A good checksum, fields that are not numbers.
        let mut h = header("SECRETNAME", b'0', 0);
        h[124..136].copy_from_slice(b"SECRETSECRE\0");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let m = all(&h).unwrap_err().to_string();
        assert!(!m.contains("SECRET"), "{m}");
        assert!(m.contains("size field"), "{m}");
    }

    #[test]
    fn truncation_and_misplaced_records_are_errors() {
        let mut b = Vec::new();
        entry(&mut b, "f", b'0', &[1u8; 1000]);
        assert!(all(&b[..700]).is_err(), "cut inside the data");
        assert!(all(&b[..100]).is_err(), "cut inside a header");
        assert_eq!(
            all(&b[..1000 + 512]).unwrap().len(),
            1,
            "cut in the padding"
        );
        let mut b = Vec::new();
        entry(&mut b, "././@LongLink", b'L', b"name\0");
        b.extend([0u8; 1024]);
        assert!(all(&b).is_err(), "a long name with no entry");
        let mut b = Vec::new();
        for _ in 0..2 {
            entry(&mut b, "././@LongLink", b'L', b"name\0");
        }
        entry(&mut b, "f", b'0', b"");
        assert!(all(&b).is_err(), "two long names");
        let mut b = Vec::new();
        for _ in 0..9 {
            entry(&mut b, "g", b'g', b"");
        }
        entry(&mut b, "f", b'0', b"");
        assert!(all(&b).is_err(), "too many records in a row");
    }

    fn sparse(map: &[(u64, u64)], real: u64, stored: u64) -> Vec<u8> {
        let mut h = header("s", b'S', stored);
        h[257..265].copy_from_slice(b"ustar  \0");
        for (i, (off, len)) in map.iter().enumerate() {
            let at = 386 + i * 24;
            h[at..at + 12].copy_from_slice(format!("{off:011o}\0").as_bytes());
            h[at + 12..at + 24].copy_from_slice(format!("{len:011o}\0").as_bytes());
        }
        h[483..495].copy_from_slice(format!("{real:011o}\0").as_bytes());
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let mut b = h.to_vec();
        b.resize(512 + stored.div_ceil(512) as usize * 512 + 1024, 0);
        b
    }

    #[test]
    fn sparse_maps_are_checked() {
        let ok = all(&sparse(&[(0, 512), (4096, 512)], 8192, 1024)).unwrap();
        assert_eq!(ok[0].0.size, 8192);
        assert_eq!(
            ok[0].0.sparse.as_deref(),
            Some(&[(0, 512), (4096, 512)][..])
        );
        for (map, real, stored, why) in [
            (
                &[(4096u64, 512u64), (0, 512)][..],
                8192,
                1024,
                "out of order",
            ),
            (&[(0, 512), (256, 512)][..], 8192, 1024, "overlapping"),
            (
                &[(0, 512), (8000, 512)][..],
                8192,
                1024,
                "past the real size",
            ),
            (&[(0, 512)][..], 8192, 1024, "not the stored data"),
        ] {
            let e = all(&sparse(map, real, stored)).unwrap_err().to_string();
            assert!(e.contains("sparse"), "{why}: {e}");
        }
    }

    #[test]
    fn numeric_fields() {
        assert_eq!(octal(b"0000644\0"), Some(0o644));
        assert_eq!(octal(b"  644 \0"), Some(0o644));
        assert_eq!(octal(b"\0\0\0"), None);
        assert_eq!(octal(b"12a"), None);
        assert_eq!(octal(b"77777777777777777777777"), None, "overflow");
        let mut f = [0u8; 12];
        f[0] = 0x80;
        f[4..].copy_from_slice(&5_000_000_000u64.to_be_bytes()[..]);
        assert_eq!(numeric(&f), Some(5_000_000_000));
        f[0] = 0xff;
        assert_eq!(numeric(&f), None, "negative");
        assert_eq!(decimal(b"123"), Some(123));
        assert_eq!(decimal(b"1 3"), None);
    }

    #[test]
    fn whiteout_grammar() {
        assert_eq!(whiteout(b"file"), Whiteout::No);
        assert_eq!(whiteout(b".wh.file"), Whiteout::Remove(b"file"));
        assert_eq!(whiteout(b".wh...."), Whiteout::Remove(b"..."));
        assert_eq!(whiteout(b".wh..wh..opq"), Whiteout::Opaque);
        for bad in [
            &b".wh."[..],
            b".wh..",
            b".wh...",
            b".wh..wh.plnk",
            b".wh..wh..opqx",
        ] {
            assert_eq!(whiteout(bad), Whiteout::Invalid, "{bad:?}");
        }
    }
}
