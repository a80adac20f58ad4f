//! Descriptor hygiene for the processes the broker starts: nothing the daemon inherited or
//! opened reaches a sandbox or a plugin, and children get the open-file limit the daemon
//! started with.

use std::sync::atomic::Ordering;

/// The soft and hard open-file limits the daemon started with (0: not raised).
static FD_LIMIT: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Mark every descriptor above stderr close-on-exec: whatever the daemon inherited from
/// whoever started it (an editor, a shell with `exec 8>>file`) must never reach a sandbox or a
/// plugin. Called first thing by the daemon and the stdio broker; descriptors the daemon
/// opens later are close-on-exec anyway (Rust opens every descriptor that way).
pub fn cloexec_inherited_fds() {
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC; no memory arguments.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc != 0 {
        // Before Linux 5.11: one fcntl per open descriptor.
        if let Ok(rd) = std::fs::read_dir("/proc/self/fd") {
            let fds: Vec<i32> = rd
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|fd| *fd > 2)
                .collect();
            for fd in fds {
                // SAFETY: fcntl on a descriptor number; harmless if it closed meanwhile.
                unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            }
        }
    }
}

/// In a child between fork and exec: close every descriptor above stderr that is not
/// close-on-exec (async-signal-safe).
pub fn close_inherited_in_child() {
    // SAFETY: close_range(2); no memory arguments.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// In a child between fork and exec (a system call, no allocation): give back the soft
/// open-file limit the daemon started with, so commands and plugins see the usual one.
pub fn restore_fd_limit_in_child() {
    let cur = FD_LIMIT[0].load(Ordering::Relaxed);
    if cur == 0 {
        return;
    }
    let l = libc::rlimit {
        rlim_cur: cur,
        rlim_max: FD_LIMIT[1].load(Ordering::Relaxed),
    };
    // SAFETY: setrlimit with a struct on the stack.
    unsafe {
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
    }
}

/// Raise the soft open-file limit to the hard one (at most 1M): every connection, plugin pipe
/// and exec stream is a descriptor, and the common soft limit of 1024 ends near 1000 clients.
/// Children get the original back ([`restore_fd_limit_in_child`]).
pub fn raise_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit with a struct on the stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            let want = l.rlim_max.min(1 << 20);
            if want > l.rlim_cur {
                FD_LIMIT[0].store(l.rlim_cur, Ordering::Relaxed);
                FD_LIMIT[1].store(l.rlim_max, Ordering::Relaxed);
                l.rlim_cur = want;
                libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            }
        }
    }
}
