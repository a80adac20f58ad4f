//! abx-confine: the one confinement mechanism for processes the broker starts. The builtin
//! `local` provider's sandbox processes (`abx_local::isolate`) and EPP/1 plugins
//! (`abx_plugins::permissions`) describe what a process may do as a [`Policy`]; this
//! module turns it into a Landlock ruleset and a seccomp filter before the fork
//! ([`Policy::prepare`]), and [`restrict_self`] applies both in the child between `fork` and
//! `exec` (system calls only).
//!
//! - **Filesystem** (Landlock, ABI 1+): read (and execute, unless execution is limited to a
//!   list of files) beneath the `read` paths, every right beneath the `write` paths, write and
//!   device ioctls on the terminal and null-like devices. Everything else is denied. Rights a
//!   kernel does not know are not handled (best effort), so they stay allowed.
//! - **Execution**: with `exec: Some(files)`, only those files may be executed (the runtime,
//!   its ELF interpreter, a script's interpreter).
//! - **TCP** (Landlock ABI 4+): with [`Net::Limited`], `connect` only to the listed ports and
//!   no `bind`. Landlock filters by port, not by address: a host list is enforced as the set
//!   of its ports.
//! - **Other sockets** (seccomp): with [`Net::Limited`], `socket()` is allowed for Unix
//!   sockets and TCP; UDP and netlink only when `datagrams` (name resolution); raw, packet and
//!   every other family are refused with `EACCES`, as is `io_uring_setup` (io_uring can create
//!   sockets without the `socket` system call). Syscalls of another architecture (x32, i386
//!   compat) are refused.
//! - **Scoping** (Landlock ABI 6+): with `scoped`, signals and connections to abstract Unix
//!   sockets reach only processes and sockets of the same Landlock domain (or one nested in
//!   it): nothing outside, the daemon included.
//! - **Keyrings** (seccomp, every policy): `add_key`, `request_key` and `keyctl` are refused
//!   with `ENOSYS`, in every ABI; with [`keyring::join_fresh_session`] before it, nothing of
//!   the host's keyrings is reachable ([`keyring`]).

pub mod caps;
pub mod fds;
pub mod keyring;
pub mod setid;

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, ABI,
};
use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The Landlock ABI whose filesystem rights we handle (V5 adds device ioctls). Newer rights
/// are not handled, so they stay allowed; older kernels get the subset they know.
pub const HANDLED_FS_ABI: ABI = ABI::V5;

/// The first Landlock ABI with TCP rules.
pub const NET_ABI: i32 = 4;

/// The first Landlock ABI that scopes signals and abstract Unix sockets.
pub const SCOPE_ABI: i32 = 6;

/// The environment variable that caps the Landlock ABI the broker uses (to see what happens
/// on an older kernel: `ABX_LANDLOCK_ABI_MAX=3` has no TCP rules, `0` no Landlock at all).
pub const ABI_MAX_ENV: &str = "ABX_LANDLOCK_ABI_MAX";

/// The Landlock ABI the broker uses: the kernel's, capped by [`ABI_MAX_ENV`].
pub fn landlock_abi() -> i32 {
    let kernel = kernel_landlock_abi();
    match std::env::var(ABI_MAX_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    {
        Some(max) => kernel.min(max.max(0)),
        None => kernel,
    }
}

/// The Landlock ABI version of the running kernel (0 when it has none or it is disabled).
pub fn kernel_landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no pointers.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        v as i32
    }
}

fn abi_enum(v: i32) -> ABI {
    match v {
        ..=0 => ABI::Unsupported,
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        _ => ABI::V5,
    }
}

/// Network rules.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Net {
    /// Unrestricted.
    Any,
    /// TCP `connect` only to these ports (none: no TCP), no TCP `bind`; UDP and netlink
    /// sockets only when `datagrams`.
    Limited {
        /// Ports TCP may connect to.
        tcp_connect: Vec<u16>,
        /// Allow UDP and netlink sockets (name resolution).
        datagrams: bool,
    },
}

/// What a confined process may do (serializable: the plugin launcher builds the ruleset
/// itself, after composing the plugin's mount namespace).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Policy {
    /// Trees (or files) it may read, and execute unless `exec` is set. Missing ones are skipped.
    pub read: Vec<PathBuf>,
    /// Trees it may read, write, create in and remove from. Each must exist.
    pub write: Vec<PathBuf>,
    /// `Some(files)`: only these files may be executed. Missing ones are skipped.
    pub exec: Option<Vec<PathBuf>>,
    /// Network rules.
    pub net: Net,
    /// Scope signals and abstract Unix sockets to the process's own Landlock domain (ABI 6+;
    /// hardening beyond what a policy declares: older kernels go without it).
    pub scoped: bool,
}

/// Which parts of a [`Policy`] this kernel enforces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// The Landlock ABI in use (0: none).
    pub abi: i32,
    /// Filesystem and execution rules.
    pub filesystem: bool,
    /// TCP rules (true when nothing is restricted).
    pub tcp: bool,
    /// The socket filter (true when nothing is restricted).
    pub sockets: bool,
}

impl Coverage {
    /// Everything the policy asks for is enforced.
    pub fn complete(&self) -> bool {
        self.filesystem && self.tcp && self.sockets
    }

    /// What is not enforced, for people.
    pub fn gaps(&self) -> Vec<String> {
        let mut v = Vec::new();
        if !self.filesystem {
            v.push("filesystem and execution rules need Landlock, which this kernel does not have (or it is disabled)".to_owned());
        }
        if !self.tcp {
            v.push(format!(
                "TCP rules need Landlock ABI {NET_ABI} (Linux 6.7); this kernel has ABI {}",
                self.abi
            ));
        }
        if !self.sockets {
            v.push("the socket filter needs seccomp, which this kernel does not have".to_owned());
        }

        v
    }
}

impl Policy {
    /// What this kernel can enforce of the policy.
    pub fn coverage(&self) -> Coverage {
        let abi = landlock_abi();
        let limited = self.net != Net::Any;
        Coverage {
            abi,
            filesystem: abi > 0,
            tcp: !limited || abi >= NET_ABI,
            sockets: !limited || seccomp_available(),
        }
    }

    /// Build the ruleset and the filter (before the fork: this opens paths and allocates).
    pub fn prepare(&self) -> Result<Prepared, String> {
        let abi = landlock_abi();
        let ruleset = if abi > 0 {
            Some(self.ruleset(abi)?)
        } else {
            None
        };
        let filter = match &self.net {
            Net::Limited { datagrams, .. } if seccomp_available() => {
                Some(socket_filter(*datagrams).into_boxed_slice())
            }
            _ => None,
        };
        Ok(Prepared {
            ruleset,
            filter,
            keyrings: Prepared::refusing_keyrings().keyrings,
            setid: None,
        })
    }

    fn ruleset(&self, abi: i32) -> Result<OwnedFd, String> {
        let err = |e: &dyn fmt::Display| format!("Landlock ruleset: {e}");
        let fs_abi = abi_enum(abi.min(5));
        let all = AccessFs::from_all(HANDLED_FS_ABI) & AccessFs::from_all(fs_abi);
        let mut attr = Ruleset::default()
            .handle_access(AccessFs::from_all(HANDLED_FS_ABI))
            .map_err(|e| err(&e))?;
        let limited_tcp = matches!(self.net, Net::Limited { .. }) && abi >= NET_ABI;
        if limited_tcp {
            attr = attr
                .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
                .map_err(|e| err(&e))?;
        }
        if self.scoped && abi >= SCOPE_ABI {
            attr = attr
                .scope(Scope::AbstractUnixSocket | Scope::Signal)
                .map_err(|e| err(&e))?;
        }
        let mut rs = attr.create().map_err(|e| err(&e))?;
        let read = if self.exec.is_some() {
            read_access() & !AccessFs::Execute
        } else {
            read_access()
        };
        let file_rights = AccessFs::from_file(HANDLED_FS_ABI);
        let rule = |path: &PathBuf, access: BitFlags<AccessFs>| -> Option<PathBeneath<PathFd>> {
            let is_dir = path.is_dir();
            let fd = PathFd::new(path).ok()?;
            Some(PathBeneath::new(
                fd,
                if is_dir { access } else { access & file_rights },
            ))
        };
        for p in &self.read {
            if let Some(r) = rule(p, read) {
                rs = rs.add_rule(r).map_err(|e| err(&e))?;
            }
        }
        for p in &self.write {
            let r = rule(p, all)
                .ok_or_else(|| format!("Landlock ruleset: cannot open {}", p.display()))?;
            rs = rs.add_rule(r).map_err(|e| err(&e))?;
        }
        for p in self.exec.iter().flatten() {
            if let Some(r) = rule(p, AccessFs::Execute | AccessFs::ReadFile) {
                rs = rs.add_rule(r).map_err(|e| err(&e))?;
            }
        }
        for dev in WRITABLE_DEVICES.iter().copied().chain(["/dev/pts"]) {
            // A missing device is simply not granted.
            if let Ok(fd) = PathFd::new(dev) {
                rs = rs
                    .add_rule(PathBeneath::new(fd, device_access()))
                    .map_err(|e| err(&e))?;
            }
        }
        if let (true, Net::Limited { tcp_connect, .. }) = (limited_tcp, &self.net) {
            for port in tcp_connect {
                rs = rs
                    .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                    .map_err(|e| err(&e))?;
            }
        }
        Option::<OwnedFd>::from(rs).ok_or_else(|| "Landlock is not supported".to_owned())
    }
}

/// Read rights (including execute and directory listing).
pub fn read_access() -> BitFlags<AccessFs> {
    AccessFs::from_read(HANDLED_FS_ABI)
}

/// Rights on device files confined processes may write to (terminals, null-like devices).
fn device_access() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev
}

const WRITABLE_DEVICES: [&str; 7] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
];

/// A prepared ruleset and filters, applied in the child by [`restrict_self`].
#[derive(Debug, Default)]
pub struct Prepared {
    /// The Landlock ruleset (None: no Landlock here).
    pub ruleset: Option<OwnedFd>,
    filter: Option<Box<[libc::sock_filter]>>,
    /// The keyring filter ([`keyring::filter`]; None: no seccomp here).
    keyrings: Option<Box<[libc::sock_filter]>>,
    /// The setuid/setgid filter ([`setid::filter`]), when asked for.
    setid: Option<Box<[libc::sock_filter]>>,
}

impl Prepared {
    /// Nothing but the keyring filter (where seccomp works): for a process confined by other
    /// means (the `local` sandbox's init) or not at all.
    pub fn refusing_keyrings() -> Prepared {
        Prepared {
            ruleset: None,
            filter: None,
            keyrings: seccomp_available().then(|| keyring::filter().into_boxed_slice()),
            setid: None,
        }
    }

    /// These filters, and one refusing setuid and setgid bits ([`setid`]: a process that
    /// writes host files through a mount). None where seccomp is not available.
    pub fn refusing_setid(mut self) -> Prepared {
        self.setid = seccomp_available().then(|| setid::filter().into_boxed_slice());
        self
    }

    /// Whether setuid and setgid bits will be refused.
    pub fn refuses_setid(&self) -> bool {
        self.setid.is_some()
    }

    /// Whether the keyring system calls will be refused.
    pub fn refuses_keyrings(&self) -> bool {
        self.keyrings.is_some()
    }
}

/// A failing step of [`restrict_self`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs,
    /// Installing the seccomp filter.
    Seccomp,
    /// `landlock_restrict_self`.
    Landlock,
}

/// In the child between fork and exec (system calls only, no allocation): no_new_privs,
/// the socket and keyring filters, then the Landlock ruleset. A fresh session keyring
/// ([`keyring::join_fresh_session`]) must be joined before: `keyctl` is refused after.
///
/// # Safety
/// Only call in a `pre_exec` hook (or a single-threaded child).
pub unsafe fn restrict_self(p: &Prepared) -> Result<(), (Step, i32)> {
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
        return Err((Step::NoNewPrivs, errno()));
    }
    for f in [&p.filter, &p.keyrings, &p.setid].into_iter().flatten() {
        let prog = libc::sock_fprog {
            len: f.len() as u16,
            filter: f.as_ptr() as *mut libc::sock_filter,
        };
        if libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            0u32,
            &prog as *const libc::sock_fprog,
        ) != 0
        {
            return Err((Step::Seccomp, errno()));
        }
    }
    if let Some(rs) = &p.ruleset {
        if libc::syscall(libc::SYS_landlock_restrict_self, rs.as_raw_fd(), 0u32) != 0 {
            return Err((Step::Landlock, errno()));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// What executing a program takes

/// `program` looked up like `execvp` does (a name without `/` in `path_env`).
pub fn which(program: &str, path_env: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return p.is_file().then_some(p);
    }
    path_env
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(program))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Every file the kernel opens for execution when `program` is executed: the program (as
/// named and canonical), its ELF interpreter, and for a `#!` script its interpreter (and
/// the program `env` runs), recursively (a few levels).
pub fn exec_closure(program: &Path, path_env: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    add_exec(program, path_env, &mut out, 0);
    out
}

fn add_exec(program: &Path, path_env: &str, out: &mut Vec<PathBuf>, depth: usize) {
    if depth > 4 {
        return;
    }
    let Ok(canon) = std::fs::canonicalize(program) else {
        return;
    };
    for p in [program.to_path_buf(), canon.clone()] {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    let Ok(head) = read_head(&canon) else { return };
    if let Some(interp) = elf_interpreter(&canon, &head) {
        add_exec(&interp, path_env, out, depth + 1);
    } else if let Some(line) = head.strip_prefix(b"#!") {
        let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
        let text = String::from_utf8_lossy(line);
        let mut words = text.split_whitespace();
        if let Some(interp) = words.next() {
            let interp = PathBuf::from(interp);
            let is_env = interp.file_name().is_some_and(|n| n == "env");
            add_exec(&interp, path_env, out, depth + 1);
            if is_env {
                if let Some(next) = words.find(|w| !w.starts_with('-')) {
                    if let Some(found) = which(next, path_env) {
                        add_exec(&found, path_env, out, depth + 1);
                    }
                }
            }
        }
    }
}

fn read_head(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; 4096];
    let mut f = std::fs::File::open(p)?;
    let n = f.read(&mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// The `PT_INTERP` of a 64-bit little-endian ELF file.
fn elf_interpreter(p: &Path, head: &[u8]) -> Option<PathBuf> {
    use std::io::{Read, Seek, SeekFrom};
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as u64;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    let phoff = u64_at(head, 0x20);
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    if phentsize < 56 || phnum > 256 {
        return None;
    }
    let mut f = std::fs::File::open(p).ok()?;
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    f.seek(SeekFrom::Start(phoff)).ok()?;
    f.read_exact(&mut ph).ok()?;
    for e in ph.chunks(phentsize as usize) {
        const PT_INTERP: u32 = 3;
        if u32::from_le_bytes(e[..4].try_into().ok()?) == PT_INTERP {
            let (off, size) = (u64_at(e, 8), u64_at(e, 32));
            if size == 0 || size > 4096 {
                return None;
            }
            let mut name = vec![0u8; size as usize];
            f.seek(SeekFrom::Start(off)).ok()?;
            f.read_exact(&mut name).ok()?;
            let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            use std::os::unix::ffi::OsStrExt;
            return Some(PathBuf::from(std::ffi::OsStr::from_bytes(&name[..end])));
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// seccomp

const SECCOMP_SET_MODE_FILTER: libc::c_uint = 1;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH: u32 = 0;

/// x32 system calls on x86_64 carry this bit.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Whether seccomp filters work here (and we know this architecture).
pub fn seccomp_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        AUDIT_ARCH != 0
            && std::fs::read_to_string("/proc/self/status")
                .is_ok_and(|s| s.lines().any(|l| l.starts_with("Seccomp_filters:")))
    })
}

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const BPF_AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// Offsets in `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// The low 32 bits of argument `i`.
const fn off_arg(i: u32) -> u32 {
    if cfg!(target_endian = "little") {
        16 + 8 * i
    } else {
        16 + 8 * i + 4
    }
}

/// A tiny assembler: conditional jumps name labels, resolved when done.
struct Bpf {
    code: Vec<(u16, Target, Target, u32)>,
    labels: Vec<Option<usize>>,
}

#[derive(Clone, Copy)]
enum Target {
    Next,
    Label(usize),
}

impl Bpf {
    fn new() -> Bpf {
        Bpf {
            code: Vec::new(),
            labels: Vec::new(),
        }
    }
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }
    fn bind(&mut self, l: usize) {
        self.labels[l] = Some(self.code.len());
    }
    fn ld(&mut self, off: u32) {
        self.code
            .push((BPF_LD_W_ABS, Target::Next, Target::Next, off));
    }
    fn and(&mut self, k: u32) {
        self.code.push((BPF_AND_K, Target::Next, Target::Next, k));
    }
    fn jeq(&mut self, k: u32, t: Target, f: Target) {
        self.code.push((BPF_JEQ_K, t, f, k));
    }
    fn jset(&mut self, k: u32, t: Target, f: Target) {
        self.code.push((BPF_JSET_K, t, f, k));
    }
    fn ret(&mut self, k: u32) {
        self.code.push((BPF_RET_K, Target::Next, Target::Next, k));
    }
    fn finish(self) -> Vec<libc::sock_filter> {
        let labels = self.labels;
        self.code
            .iter()
            .enumerate()
            .map(|(i, &(code, t, f, k))| {
                let rel = |x: Target| -> u8 {
                    match x {
                        Target::Next => 0,
                        Target::Label(l) => {
                            let at = labels[l].expect("bound label");
                            u8::try_from(at - i - 1).expect("short jump")
                        }
                    }
                };
                libc::sock_filter {
                    code,
                    jt: rel(t),
                    jf: rel(f),
                    k,
                }
            })
            .collect()
    }
}

/// The socket filter: Unix and TCP sockets (Landlock governs TCP); UDP and netlink only
/// with `datagrams`; nothing else; no io_uring; no foreign-architecture system calls.
fn socket_filter(datagrams: bool) -> Vec<libc::sock_filter> {
    let deny = SECCOMP_RET_ERRNO | libc::EACCES as u32;
    let mut b = Bpf::new();
    let (allow, refuse, inet, stream) = (b.label(), b.label(), b.label(), b.label());
    b.ld(OFF_ARCH);
    b.jeq(AUDIT_ARCH, Target::Next, Target::Label(refuse));
    b.ld(OFF_NR);
    if cfg!(target_arch = "x86_64") {
        b.jset(X32_SYSCALL_BIT, Target::Label(refuse), Target::Next);
    }
    b.jeq(
        libc::SYS_io_uring_setup as u32,
        Target::Label(refuse),
        Target::Next,
    );
    b.jeq(libc::SYS_socket as u32, Target::Next, Target::Label(allow));
    // socket(domain, type, protocol)
    b.ld(off_arg(0));
    b.jeq(libc::AF_UNIX as u32, Target::Label(allow), Target::Next);
    if datagrams {
        b.jeq(libc::AF_NETLINK as u32, Target::Label(allow), Target::Next);
    }
    b.jeq(libc::AF_INET as u32, Target::Label(inet), Target::Next);
    b.jeq(
        libc::AF_INET6 as u32,
        Target::Label(inet),
        Target::Label(refuse),
    );
    b.bind(inet);
    b.ld(off_arg(1));
    b.and(0xf); // SOCK_TYPE_MASK: without SOCK_NONBLOCK / SOCK_CLOEXEC
    if datagrams {
        b.jeq(libc::SOCK_DGRAM as u32, Target::Label(allow), Target::Next);
    }
    b.jeq(
        libc::SOCK_STREAM as u32,
        Target::Label(stream),
        Target::Label(refuse),
    );
    b.bind(stream);
    // TCP only (Landlock's TCP rules cover it; SCTP or MPTCP would not be).
    b.ld(off_arg(2));
    b.jeq(0, Target::Label(allow), Target::Next);
    b.jeq(
        libc::IPPROTO_TCP as u32,
        Target::Label(allow),
        Target::Label(refuse),
    );
    b.bind(allow);
    b.ret(SECCOMP_RET_ALLOW);
    b.bind(refuse);
    b.ret(deny);
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// Runs `sh -c script` under `policy`; returns (exit ok, stderr).
    fn run(policy: &Policy, prog: &str, args: &[&str]) -> (bool, String) {
        let prepared = policy.prepare().expect("prepare");
        let mut cmd = Command::new(prog);
        cmd.args(args);
        // SAFETY: restrict_self makes system calls only.
        unsafe {
            cmd.pre_exec(move || {
                restrict_self(&prepared).map_err(|(_, e)| std::io::Error::from_raw_os_error(e))
            });
        }
        let out = cmd.output().expect("spawn");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn system_read() -> Vec<PathBuf> {
        ["/usr", "/bin", "/lib", "/lib64", "/etc", "/proc", "/dev"]
            .iter()
            .map(PathBuf::from)
            .collect()
    }

    #[test]
    fn filter_jumps_resolve() {
        for d in [false, true] {
            let f = socket_filter(d);
            assert!(f.len() > 10);
            assert_eq!(f.last().map(|i| i.code), Some(BPF_RET_K));
        }
    }

    #[test]
    fn filesystem_and_exec_rules() {
        if landlock_abi() == 0 {
            eprintln!("no Landlock here: skipped");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let w = dir.path().join("w");
        std::fs::create_dir(&w).unwrap();
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let mut p = Policy {
            read: system_read(),
            write: vec![w.clone()],
            exec: None,
            net: Net::Any,
            scoped: false,
        };
        let script = format!(
            "echo x > {}/a && ! echo y > {}/b",
            w.display(),
            other.display()
        );
        let (ok, err) = run(&p, "/bin/sh", &["-c", &script]);
        assert!(ok, "{err}");
        assert!(w.join("a").exists() && !other.join("b").exists());
        // Execution limited to sh itself (and its loader): running /bin/true is refused.
        let sh = exec_closure(Path::new("/bin/sh"), "/usr/bin:/bin");
        assert!(sh.len() >= 2, "sh and its ELF interpreter: {sh:?}");
        p.exec = Some(sh);
        let (ok, err) = run(&p, "/bin/sh", &["-c", "echo still runs"]);
        assert!(ok, "{err}");
        let (ok, _) = run(&p, "/bin/sh", &["-c", "/bin/true"]);
        assert!(!ok, "exec of /bin/true must be refused");
    }

    #[test]
    fn scoping_keeps_signals_and_abstract_sockets_inside() {
        if landlock_abi() < SCOPE_ABI {
            eprintln!("no Landlock scoping on this kernel: skipped");
            return;
        }
        // A process outside (same uid) and an abstract socket bound outside.
        let mut victim = Command::new("sleep").arg("30").spawn().expect("sleep");
        let name = format!("abx-scope-test-{}", std::process::id());
        let addr = <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(&name)
            .expect("abstract name");
        let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind");
        let probe = format!(
            "kill -0 {pid} 2>/dev/null && echo signal-reached; \
             python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"\\0{name}\"); print(\"socket-reached\")' 2>/dev/null; \
             sleep 0 & kill -0 $! && echo own-child-ok",
            pid = victim.id()
        );
        let mut p = Policy {
            read: system_read(),
            write: vec![],
            exec: None,
            net: Net::Any,
            scoped: false,
        };
        let out = |p: &Policy| {
            let prepared = p.prepare().expect("prepare");
            let mut cmd = Command::new("/bin/sh");
            cmd.args(["-c", &probe]);
            // SAFETY: restrict_self makes system calls only.
            unsafe {
                cmd.pre_exec(move || {
                    restrict_self(&prepared).map_err(|(_, e)| std::io::Error::from_raw_os_error(e))
                });
            }
            String::from_utf8_lossy(&cmd.output().expect("spawn").stdout).into_owned()
        };
        // Unscoped, both reach out (what the attacker did); scoped, neither does.
        let open = out(&p);
        assert!(open.contains("signal-reached"), "{open}");
        let has_python = Command::new("python3").arg("-V").output().is_ok();
        if has_python {
            assert!(open.contains("socket-reached"), "{open}");
        }
        p.scoped = true;
        let shut = out(&p);
        assert!(!shut.contains("signal-reached"), "{shut}");
        assert!(!shut.contains("socket-reached"), "{shut}");
        assert!(shut.contains("own-child-ok"), "{shut}");
        let _ = victim.kill();
        let _ = victim.wait();
    }

    #[test]
    fn sockets_are_filtered() {
        if !seccomp_available() {
            return;
        }
        let p = Policy {
            read: system_read(),
            write: vec![],
            exec: None,
            net: Net::Limited {
                tcp_connect: vec![],
                datagrams: false,
            },
            scoped: false,
        };
        // bash's /dev/udp redirection opens a UDP socket (sh has no way to).
        if !std::path::Path::new("/bin/bash").exists() {
            return;
        }
        let (ok, _) = run(&p, "/bin/bash", &["-c", "exec 3<>/dev/udp/127.0.0.1/9"]);
        assert!(!ok, "a UDP socket must be refused");
        let (ok, err) = run(&p, "/bin/bash", &["-c", "echo fine"]);
        assert!(ok, "{err}");
    }
}
