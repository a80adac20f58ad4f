//! No setuid or setgid bit set through a writable host mount (issue 43).
//!
//! A root daemon's sandbox sees an `rw` mount's owner as its own user through an idmapped
//! mount, and the owner may set any mode bit on their files: without this filter, a
//! sandbox could leave a setuid file of the host user (of root, when root owns the source)
//! on the host. The mount is `nosuid` in the sandbox; on the host it would not be. So a
//! sandbox with an `rw` mount runs under a seccomp filter that refuses with `EPERM`:
//!
//! - `chmod`, `fchmod`, `fchmodat`, `fchmodat2` whose mode has `S_ISUID` or `S_ISGID`;
//! - `open`, `openat`, `creat` creating a file (`O_CREAT` or `O_TMPFILE`) with those bits,
//!   `mkdir`, `mkdirat`, `mknod`, `mknodat` with them;
//!
//! and with `ENOSYS` (as a kernel without them, which programs handle by falling back)
//! `openat2`, whose mode is in a struct a filter cannot read, and `io_uring_setup` (io_uring
//! opens files without a system call of its own). In every ABI the process can call (i386
//! and x32 on x86_64, arm32 on aarch64). The kernel itself clears both bits when a file is
//! written or its owner changed by a process without `CAP_FSETID`, which sandboxes lack.

use super::{
    off_arg, Bpf, Target, AUDIT_ARCH, OFF_ARCH, OFF_NR, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO,
};

/// A checked call: its number, the argument holding open flags (checked for `O_CREAT` or
/// `O_TMPFILE` first) and the one holding the mode.
#[derive(Clone, Copy)]
struct Rule {
    nr: u32,
    flags: Option<u32>,
    mode: u32,
}

const fn r(nr: u32, flags: Option<u32>, mode: u32) -> Rule {
    Rule { nr, flags, mode }
}

const S_ISUID_GID: u32 = 0o6000;
const O_CREAT: u32 = 0o100;
const O_TMPFILE_BIT: u32 = 0o2000_0000;

#[cfg(target_arch = "x86_64")]
fn abis() -> Vec<(u32, Vec<Rule>, Vec<u32>)> {
    vec![
        (
            AUDIT_ARCH,
            vec![
                r(libc::SYS_chmod as u32, None, 1),
                r(libc::SYS_fchmod as u32, None, 1),
                r(libc::SYS_fchmodat as u32, None, 2),
                r(452, None, 2), // fchmodat2
                r(libc::SYS_open as u32, Some(1), 2),
                r(libc::SYS_openat as u32, Some(2), 3),
                r(libc::SYS_creat as u32, None, 1),
                r(libc::SYS_mkdir as u32, None, 1),
                r(libc::SYS_mkdirat as u32, None, 2),
                r(libc::SYS_mknod as u32, None, 1),
                r(libc::SYS_mknodat as u32, None, 2),
            ],
            vec![437, 425], // openat2, io_uring_setup
        ),
        // i386 (`int 0x80`).
        (
            0x4000_0003,
            vec![
                r(15, None, 1),
                r(94, None, 1),
                r(306, None, 2),
                r(452, None, 2),
                r(5, Some(1), 2),
                r(295, Some(2), 3),
                r(8, None, 1),
                r(39, None, 1),
                r(296, None, 2),
                r(14, None, 1),
                r(297, None, 2),
            ],
            vec![437, 425],
        ),
    ]
}

#[cfg(target_arch = "aarch64")]
fn abis() -> Vec<(u32, Vec<Rule>, Vec<u32>)> {
    vec![
        (
            AUDIT_ARCH,
            vec![
                r(libc::SYS_fchmod as u32, None, 1),
                r(libc::SYS_fchmodat as u32, None, 2),
                r(452, None, 2),
                r(libc::SYS_openat as u32, Some(2), 3),
                r(libc::SYS_mkdirat as u32, None, 2),
                r(libc::SYS_mknodat as u32, None, 2),
            ],
            vec![437, 425],
        ),
        // arm32 (EABI).
        (
            0x4000_0028,
            vec![
                r(15, None, 1),
                r(94, None, 1),
                r(333, None, 2),
                r(452, None, 2),
                r(5, Some(1), 2),
                r(322, Some(2), 3),
                r(8, None, 1),
                r(39, None, 1),
                r(323, None, 2),
                r(14, None, 1),
                r(324, None, 2),
            ],
            vec![437, 425],
        ),
    ]
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn abis() -> Vec<(u32, Vec<Rule>, Vec<u32>)> {
    Vec::new()
}

/// The seccomp filter refusing setuid and setgid bits (everything else allowed).
pub fn filter() -> Vec<libc::sock_filter> {
    let mut b = Bpf::new();
    let (allow, eperm, enosys) = (b.label(), b.label(), b.label());
    b.ld(OFF_ARCH);
    for (arch, rules, refused) in abis() {
        let other = b.label();
        b.jeq(arch, Target::Next, Target::Label(other));
        b.ld(OFF_NR);
        if cfg!(target_arch = "x86_64") && arch == AUDIT_ARCH {
            // x32 calls carry the x32 bit on the same numbers.
            b.and(!super::X32_SYSCALL_BIT);
        }
        for nr in refused {
            b.jeq(nr, Target::Label(enosys), Target::Next);
        }
        for rule in rules {
            let skip = b.label();
            b.jeq(rule.nr, Target::Next, Target::Label(skip));
            if let Some(f) = rule.flags {
                b.ld(off_arg(f));
                b.jset(O_CREAT | O_TMPFILE_BIT, Target::Next, Target::Label(allow));
            }
            b.ld(off_arg(rule.mode));
            b.jset(S_ISUID_GID, Target::Label(eperm), Target::Label(allow));
            b.bind(skip);
        }
        b.jeq(0, Target::Label(allow), Target::Label(allow));
        b.bind(other);
    }
    b.bind(allow);
    b.ret(SECCOMP_RET_ALLOW);
    b.bind(eperm);
    b.ret(SECCOMP_RET_ERRNO | libc::EPERM as u32);
    b.bind(enosys);
    b.ret(SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    #[test]
    fn the_filter_assembles() {
        let f = filter();
        assert!(f.len() > 20, "{}", f.len());
        assert_eq!(f.last().map(|i| i.code), Some(super::super::BPF_RET_K));
    }

    /// A child under the filter: chmod u+s and g+s, creating a setuid file and a setgid
    /// directory are refused; plain modes still work.
    #[test]
    fn setid_bits_are_refused() {
        if !super::super::seccomp_available() {
            eprintln!("no seccomp here: skipped");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, "x").unwrap();
        let prepared = crate::Prepared::default().refusing_setid();
        let script = format!(
            "cd {d} && chmod 0644 f && ! chmod u+s f 2>/dev/null && ! chmod g+s f 2>/dev/null && \
             ! chmod 4755 f 2>/dev/null && ! mkdir -m 2755 sg 2>/dev/null && mkdir -m 755 ok && \
             ! install -m 4755 f suid 2>/dev/null; test ! -u f && test ! -g f && echo fine",
            d = dir.path().display()
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", &script]);
        // SAFETY: system calls only.
        unsafe {
            cmd.pre_exec(move || {
                crate::restrict_self(&prepared)
                    .map_err(|(_, e)| std::io::Error::from_raw_os_error(e))
            });
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "fine",
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!dir.path().join("sg").exists());
        let m = std::fs::metadata(&f).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(m.permissions().mode() & 0o6000, 0);
    }
}
