//! Dropping capabilities in a child between fork and exec (async-signal-safe): the
//! bounding and ambient sets and every capability. Used by the sandbox init, the weaker
//! sandbox models' children and the plugin launcher.

/// Which step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Dropping a capability from the bounding set.
    Bound,
    /// `capset` to empty.
    Set,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Clear the bounding and ambient sets and every capability (`strict`: a refused bounding
/// drop is an error). Async-signal-safe; the error names the step and its errno.
///
/// # Safety
/// Only in a child between fork and exec (or a single-threaded process about to exec).
pub unsafe fn drop_all(last_cap: i32, strict: bool) -> Result<(), (Step, i32)> {
    libc::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL,
        0 as libc::c_ulong,
        0 as libc::c_ulong,
        0 as libc::c_ulong,
    );
    for cap in 0..=last_cap {
        if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
            let e = errno();
            // EINVAL: a cap this kernel does not know. EPERM: no CAP_SETPCAP (an unprivileged
            // user in the Landlock model has no caps to lose, and no_new_privs stops gaining).
            if e == libc::EINVAL || (e == libc::EPERM && !strict) {
                continue;
            }
            return Err((Step::Bound, e));
        }
    }
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    if libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) < 0 {
        return Err((Step::Set, errno()));
    }
    Ok(())
}

/// The highest capability number this kernel knows.
pub fn last_cap() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}
