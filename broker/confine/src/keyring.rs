//! The kernel keyrings of confined processes (issue 42).
//!
//! Keyrings are not namespaced. A process inherits its parent's session keyring, and with it
//! possession of every key in it: possession gives a possessor's rights, which for a key added
//! with `keyctl add user NAME SECRET @s` include reading it. Beyond that, any key or keyring
//! whose owner is the caller's host uid can be named by its id (listed in `/proc/keys`, or
//! guessed), and the ones whose owner rights include `link` (every user keyring, every
//! session keyring a login or `keyctl` made) can be linked into the caller's own session
//! keyring, which makes everything in them possessed, and readable. That is the daemon's
//! user for a user's daemon (its sandboxes and plugins run as that uid), and one shared uid
//! for all of a root daemon's sandboxes. A new user namespace gives a process its own `@u`,
//! not its own key ids.
//!
//! So a confined process gets both:
//! - [`join_fresh_session`]: a new, empty, anonymous session keyring that only its
//!   possessors (the process and its descendants) may view, search or link: nothing it
//!   inherited is possessed any more, and another process of the same uid cannot link it.
//! - [`filter`]: a seccomp filter refusing `add_key`, `request_key` and `keyctl` with
//!   `ENOSYS` (what a kernel without keyrings answers, which programs handle), in every ABI the
//!   process can call (x32 and i386 on x86_64, arm32 on aarch64): no key is looked up by id,
//!   no keyring linked, none left for the next sandbox. Built by [`super::Policy::prepare`]
//!   and [`super::Prepared::refusing_keyrings`], installed by [`super::restrict_self`].

use super::{Bpf, Target, AUDIT_ARCH, OFF_ARCH, OFF_NR, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO};

const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
const KEYCTL_SETPERM: libc::c_long = 5;
const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
/// View, read, write, search, link and setattr for possessors; nothing for the owner's uid,
/// its group or others.
const KEY_POS_ALL: libc::c_long = 0x3f00_0000;

/// Replace the calling process's session keyring with a new, empty, anonymous one that only
/// its possessors may use. `Err(errno)` when that fails; a process the kernel refuses every
/// keyring call (`ENOSYS`: no keyrings here; `EPERM`: a seccomp filter of a container) has no
/// keyring to inherit or reach, which is fine.
///
/// # Safety
/// System calls only: fine between `fork` and `exec`. Call it before [`filter`] is installed.
pub unsafe fn join_fresh_session() -> Result<(), i32> {
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // A null name: a new anonymous keyring, joined.
    if libc::syscall(
        libc::SYS_keyctl,
        KEYCTL_JOIN_SESSION_KEYRING,
        0 as libc::c_long,
    ) < 0
    {
        let e = errno();
        return if e == libc::ENOSYS || e == libc::EPERM {
            Ok(())
        } else {
            Err(e)
        };
    }
    // A joined keyring lets its owner's uid view, read and link it: another sandbox of the
    // same uid could link it into its own session and read what this one keeps there.
    if libc::syscall(
        libc::SYS_keyctl,
        KEYCTL_SETPERM,
        KEY_SPEC_SESSION_KEYRING,
        KEY_POS_ALL,
    ) < 0
    {
        return Err(errno());
    }
    Ok(())
}

/// `add_key`, `request_key`, `keyctl` of each ABI a process of this build can call:
/// (audit arch, the three numbers).
#[cfg(target_arch = "x86_64")]
const ABIS: [(u32, [u32; 3]); 2] = [
    (
        AUDIT_ARCH,
        [
            libc::SYS_add_key as u32,
            libc::SYS_request_key as u32,
            libc::SYS_keyctl as u32,
        ],
    ),
    // i386 (`int 0x80`).
    (0x4000_0003, [286, 287, 288]),
];
#[cfg(target_arch = "aarch64")]
const ABIS: [(u32, [u32; 3]); 2] = [
    (
        AUDIT_ARCH,
        [
            libc::SYS_add_key as u32,
            libc::SYS_request_key as u32,
            libc::SYS_keyctl as u32,
        ],
    ),
    // arm32 (EABI).
    (0x4000_0028, [309, 310, 311]),
];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ABIS: [(u32, [u32; 3]); 0] = [];

/// The seccomp filter refusing the keyring system calls (everything else allowed).
pub fn filter() -> Vec<libc::sock_filter> {
    let refused = SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    let mut b = Bpf::new();
    let (allow, refuse) = (b.label(), b.label());
    b.ld(OFF_ARCH);
    for (arch, nrs) in ABIS {
        let other = b.label();
        b.jeq(arch, Target::Next, Target::Label(other));
        b.ld(OFF_NR);
        if cfg!(target_arch = "x86_64") && arch == AUDIT_ARCH {
            // x32 calls carry the x32 bit on the same numbers.
            b.and(!super::X32_SYSCALL_BIT);
        }
        b.jeq(nrs[0], Target::Label(refuse), Target::Next);
        b.jeq(nrs[1], Target::Label(refuse), Target::Next);
        b.jeq(nrs[2], Target::Label(refuse), Target::Label(allow));
        b.bind(other);
    }
    b.bind(allow);
    b.ret(SECCOMP_RET_ALLOW);
    b.bind(refuse);
    b.ret(refused);
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
        assert!(f.len() >= 4, "{}", f.len());
        assert_eq!(f.last().map(|i| i.code), Some(super::super::BPF_RET_K));
    }

    /// `keyctl(KEYCTL_GET_KEYRING_ID, @s)` through each ABI this process can call: the native
    /// one, x32 and i386 (`int 0x80`) on x86_64. `-errno` on failure. No allocation (it runs
    /// in a forked child too).
    fn session_id_through_each_abi() -> [Option<(&'static str, i64)>; 3] {
        let errno = || -(std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as i64);
        let mut v = [None; 3];
        // SAFETY: keyctl with integer arguments only.
        let r =
            unsafe { libc::syscall(libc::SYS_keyctl, 0 as libc::c_long, -3 as libc::c_long, 0) };
        v[0] = Some(("native", if r < 0 { errno() } else { r }));
        #[cfg(target_arch = "x86_64")]
        {
            let nr = libc::SYS_keyctl | super::super::X32_SYSCALL_BIT as libc::c_long;
            // SAFETY: as above.
            let r = unsafe { libc::syscall(nr, 0 as libc::c_long, -3 as libc::c_long, 0) };
            v[1] = Some(("x32", if r < 0 { errno() } else { r }));
            let r: i32;
            // SAFETY: the i386 keyctl (288) with integer arguments (ebx, which LLVM keeps for
            // itself, swapped in and out); `int 0x80` touches no memory of ours.
            unsafe {
                std::arch::asm!(
                    "xchg {b:r}, rbx",
                    "int 0x80",
                    "xchg {b:r}, rbx",
                    b = inout(reg) 0u64 => _,
                    inlateout("eax") 288i32 => r,
                    in("ecx") -3i32,
                    in("edx") 0i32,
                );
            }
            v[2] = Some(("i386", r as i64));
        }
        v
    }

    /// A child with a fresh session keyring and the filter: `keyctl` is refused, through every
    /// ABI, as if the kernel had no keyrings; without the filter each ABI the kernel offers
    /// reaches the keyrings (so the check means something here).
    #[test]
    fn keyring_calls_are_refused_in_every_abi() {
        if !super::super::seccomp_available() {
            eprintln!("no seccomp here: skipped");
            return;
        }
        let open: Vec<&str> = session_id_through_each_abi()
            .into_iter()
            .flatten()
            .filter(|(_, r)| *r != -(libc::ENOSYS as i64))
            .map(|(abi, _)| abi)
            .collect();
        eprintln!("ABIs with keyrings here: {open:?}");
        assert!(open.contains(&"native"));
        let prepared = crate::Prepared::refusing_keyrings();
        assert!(prepared.refuses_keyrings());
        let mut cmd = Command::new("/bin/true");
        // SAFETY: system calls only.
        unsafe {
            cmd.pre_exec(move || {
                join_fresh_session().map_err(std::io::Error::from_raw_os_error)?;
                crate::restrict_self(&prepared)
                    .map_err(|(_, e)| std::io::Error::from_raw_os_error(e))?;
                for (_, r) in session_id_through_each_abi().into_iter().flatten() {
                    if r != -(libc::ENOSYS as i64) {
                        return Err(std::io::Error::other("a keyring call was not refused"));
                    }
                }
                Ok(())
            });
        }
        let out = cmd.output().expect("spawn");
        assert!(out.status.success(), "{out:?}");
    }
}
