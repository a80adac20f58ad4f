//! A fuzzing smoke run without libFuzzer: replay every corpus and regression input of a
//! target, then feed it mutations of them (bit flips, byte edits, splices, repeats, JSON and
//! framing tokens) from a seeded generator for a time budget. It finds less than libFuzzer
//! (no coverage feedback) but needs no nightly features and no sanitizer build, so it runs in
//! the test command on every change. `scripts/fuzz` is the real thing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Tokens spliced into inputs: the syntax the targets branch on.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b",",
    b":",
    b"\n",
    b"\r\n",
    b"\r\n\r\n",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"true",
    b"-0",
    b"1e999",
    b"9223372036854775808",
    b"-9223372036854775809",
    b"\"jsonrpc\":\"2.0\"",
    b"\"id\":",
    b"\"method\":",
    b"\"params\":",
    b"\"result\":",
    b"\"error\":",
    b"\"code\":",
    b"\"message\":",
    b"\"data\":{\"abx\":\"E2009\"}",
    b"Content-Length: ",
    b"content-length:",
    b"Content-Type: x\r\n",
    b"18446744073709551616",
    b"[[",
    b"=",
    b"[runtime]\n",
    b"[config.k]\n",
    b"\"\"\"",
    b"'''",
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"exec/output",
    b"\"execId\":\"e\"",
];

/// xorshift64*: small, seeded, good enough to pick mutations.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (never zero inside).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// One mutation of `input`, sometimes splicing `other` in.
pub fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let at = rng.below(v.len() + 1);
        match rng.below(9) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next_u64() as u8;
            }
            2 if !v.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                v.drain(at.min(end)..end);
            }
            3 => v.insert(at, rng.next_u64() as u8),
            4 | 5 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(at..at, t.iter().copied());
            }
            6 if !other.is_empty() => {
                let a = rng.below(other.len());
                let b = (a + 1 + rng.below(64)).min(other.len());
                v.splice(at..at, other[a..b].iter().copied());
            }
            7 if !v.is_empty() => {
                // Repeat a slice: long lines, deep nesting, many messages.
                let a = rng.below(v.len());
                let b = (a + 1 + rng.below(32)).min(v.len());
                let piece = v[a..b].to_vec();
                for _ in 0..1 + rng.below(64) {
                    v.splice(at..at, piece.iter().copied());
                }
            }
            _ => v.truncate(at),
        }
    }
    if v.len() > 256 * 1024 {
        v.truncate(256 * 1024);
    }
    v
}

/// Every file under `dirs` (missing dirs are skipped), sorted for a stable order.
pub fn inputs(dirs: &[PathBuf]) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = vec![];
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = rd.filter_map(|e| Some(e.ok()?.path())).collect();
        paths.sort();
        for p in paths {
            if p.is_file() {
                let bytes = std::fs::read(&p).expect("read corpus file");
                out.push((p, bytes));
            }
        }
    }
    out
}

/// What a smoke run did.
#[derive(Debug)]
pub struct Report {
    /// Corpus and regression inputs replayed.
    pub replayed: usize,
    /// Mutated inputs run.
    pub mutated: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Replay `name`'s seeds (`fuzz/seeds/NAME`), regressions (`fuzz/regressions/NAME`) and local
/// corpus (`fuzz/corpus/NAME`, what `scripts/fuzz` grew, when there is one), then mutate them
/// for `budget`. A failing input is written to `fuzz/artifacts/NAME/` before
/// the panic goes on, so it can be replayed (`cargo fuzz run NAME FILE`) and kept as a
/// regression.
pub fn run(root: &Path, name: &str, target: fn(&[u8]), budget: Duration, seed: u64) -> Report {
    let dirs = [
        root.join("seeds").join(name),
        root.join("regressions").join(name),
        root.join("corpus").join(name),
    ];
    let corpus = inputs(&dirs);
    let start = Instant::now();
    let save = |bytes: &[u8]| {
        let dir = root.join("artifacts").join(name);
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("smoke-crash-{seed:x}-{}", bytes.len()));
        let _ = std::fs::write(&path, bytes);
        eprintln!("{name}: failing input saved to {}", path.display());
    };
    for (path, bytes) in &corpus {
        if std::panic::catch_unwind(|| target(bytes)).is_err() {
            panic!("{name}: corpus input {} fails", path.display());
        }
    }
    let mut rng = Rng::new(seed);
    let mut mutated = 0u64;
    let empty: Vec<u8> = vec![];
    while start.elapsed() < budget {
        for _ in 0..64 {
            let base = corpus.get(rng.below(corpus.len())).map_or(&empty, |c| &c.1);
            let other = corpus.get(rng.below(corpus.len())).map_or(&empty, |c| &c.1);
            let input = mutate(&mut rng, base, other);
            if std::panic::catch_unwind(|| target(&input)).is_err() {
                save(&input);
                panic!("{name}: a mutated input fails (seed {seed:#x})");
            }
            mutated += 1;
        }
    }
    Report {
        replayed: corpus.len(),
        mutated,
        elapsed: start.elapsed(),
    }
}
