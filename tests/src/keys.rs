//! Keys on the host as a login session has them (issue 42): the daemon's starter runs in a
//! session keyring of its own (pam_keyinit makes one per login and links the user keyring
//! into it) holding a key (`keyctl add user NAME SECRET @s`), and the user keyring (`@u`)
//! holds another. Made with
//! the system calls, so no `keyctl` binary is needed. The probe that looks for them from
//! inside is `tests/fixtures/plugins/sock-probe/keyprobe.py`.

use crate::Home;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

/// The probe (a sandbox runs it as `python3 -c KEYPROBE TAG [ID...]`).
pub const KEYPROBE: &str = include_str!("../fixtures/plugins/sock-probe/keyprobe.py");

const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
const KEYCTL_LINK: libc::c_long = 8;
const KEYCTL_SET_TIMEOUT: libc::c_long = 15;
const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
const KEY_SPEC_USER_KEYRING: libc::c_long = -4;

/// The host's keys the daemon's starter had (ids as on the host). Dropped, the key in the
/// user keyring is taken out of it (the session keyring goes with the daemon).
#[derive(Debug)]
pub struct HostKeys {
    /// The session keyring the daemon inherited.
    pub session: i32,
    /// The key in it.
    pub key: i32,
    /// The user keyring of the daemon's user.
    pub user_ring: i32,
    /// The key in that.
    pub user_key: i32,
    /// Their payloads.
    pub secrets: Vec<String>,
    /// Their descriptions.
    pub names: Vec<String>,
    /// Whose user keyring holds `user_key` (None: this process's uid).
    user: Option<u32>,
}

impl Drop for HostKeys {
    fn drop(&mut self) {
        const KEYCTL_UNLINK: libc::c_long = 9;
        let user_key = self.user_key as libc::c_long;
        // Any process of the uid may write its user keyring (`@u` is possessed by name).
        // SAFETY: keyctl with integers.
        let unlink = move || unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_UNLINK,
                user_key,
                KEY_SPEC_USER_KEYRING,
            )
        };
        match self.user {
            None => {
                unlink();
            }
            Some(u) => {
                let mut cmd = std::process::Command::new("/bin/true");
                cmd.uid(u).gid(u);
                // SAFETY: one system call.
                unsafe {
                    cmd.pre_exec(move || {
                        unlink();
                        Ok(())
                    });
                }
                let _ = cmd.status();
            }
        }
    }
}

#[repr(C)]
#[derive(Default)]
struct Ids {
    session: i32,
    key: i32,
    user_ring: i32,
    user_key: i32,
}

impl HostKeys {
    /// The ids, as probe arguments.
    pub fn ids(&self) -> Vec<String> {
        [self.session, self.key, self.user_ring, self.user_key]
            .iter()
            .map(i32::to_string)
            .collect()
    }

    /// Fails when `text` (what `who` reported) holds a host key's payload or description.
    pub fn assert_not_in(&self, text: &str, who: &str) {
        for n in self.secrets.iter().chain(&self.names) {
            assert!(
                !text.contains(n.as_str()),
                "{who} found the host's '{n}':\n{text}"
            );
        }
    }

    /// Fails when `text` holds a host key's payload, or its description anywhere but in a
    /// line of `/proc/keys` (`procKeys: `), which a process that shares the host's `/proc`
    /// reads (the names of the keys its uid may view, not their contents).
    pub fn assert_no_secret_in(&self, text: &str, who: &str) {
        for n in &self.secrets {
            assert!(
                !text.contains(n.as_str()),
                "{who} found the host's '{n}':\n{text}"
            );
        }
        for line in text.lines().filter(|l| !l.starts_with("procKeys: ")) {
            for n in &self.names {
                assert!(
                    !line.contains(n.as_str()),
                    "{who} found the host's '{n}':\n{text}"
                );
            }
        }
    }
}

/// `abx broker start` for `home` (as uid and gid `user` when given) in a fresh session keyring
/// holding a new key and linking the user keyring, with a key added to the user keyring too:
/// the daemon inherits that session keyring, as it would from a login. Keys expire after 5
/// minutes (the one in the user keyring would otherwise outlive the test).
pub fn start_with_host_keys(home: &Home, user: Option<u32>, tag: &str) -> HostKeys {
    let desc = CString::new(format!("abx-host-key-{tag}")).unwrap();
    let secret = format!("HOSTSECRET-{tag}");
    let user_desc = CString::new(format!("abx-host-user-key-{tag}")).unwrap();
    let user_secret = format!("HOSTUSERSECRET-{tag}");
    let mut p = [0; 2];
    // SAFETY: pipe2 into a local array.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both were just made.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    let wfd = w.as_raw_fd();
    let mut cmd = home.abx();
    cmd.args(["broker", "start"]);
    if let Some(u) = user {
        cmd.uid(u).gid(u).env("HOME", &home.path);
    }
    let (s1, s2) = (
        secret.clone().into_bytes(),
        user_secret.clone().into_bytes(),
    );
    let (d1, d2) = (desc.clone(), user_desc.clone());
    // SAFETY: system calls only, on data made before the fork (after the uid change).
    unsafe {
        cmd.pre_exec(move || {
            let keyctl = |op: libc::c_long, a: libc::c_long, b: libc::c_long| {
                libc::syscall(
                    libc::SYS_keyctl,
                    op,
                    a,
                    b,
                    0 as libc::c_long,
                    0 as libc::c_long,
                )
            };
            let add = |d: &CString, p: &[u8], ring: libc::c_long| {
                libc::syscall(
                    libc::SYS_add_key,
                    c"user".as_ptr(),
                    d.as_ptr(),
                    p.as_ptr(),
                    p.len(),
                    ring,
                )
            };
            if keyctl(KEYCTL_JOIN_SESSION_KEYRING, 0, 0) < 0
                || keyctl(KEYCTL_LINK, KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let key = add(&d1, &s1, KEY_SPEC_SESSION_KEYRING);
            let user_key = add(&d2, &s2, KEY_SPEC_USER_KEYRING);
            if key < 0 || user_key < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Possessed (through the session keyring), so their owner may set it.
            if keyctl(KEYCTL_SET_TIMEOUT, key, 300) < 0
                || keyctl(KEYCTL_SET_TIMEOUT, user_key, 300) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let ids = Ids {
                session: keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0) as i32,
                key: key as i32,
                user_ring: keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0) as i32,
                user_key: user_key as i32,
            };
            let n = std::mem::size_of::<Ids>();
            if libc::write(wfd, (&ids as *const Ids).cast(), n) != n as isize {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("abx broker start");
    drop(w);
    assert!(
        out.status.success(),
        "broker start with host keys failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut ids = Ids::default();
    let n = std::mem::size_of::<Ids>();
    // SAFETY: reading into a local struct of plain integers.
    let got = unsafe { libc::read(r.as_raw_fd(), (&mut ids as *mut Ids).cast(), n) };
    assert_eq!(got, n as isize, "the key ids from the starter");
    assert!(ids.session > 0 && ids.user_ring > 0, "keyring ids");
    HostKeys {
        session: ids.session,
        key: ids.key,
        user_ring: ids.user_ring,
        user_key: ids.user_key,
        secrets: vec![secret, user_secret],
        names: vec![
            desc.into_string().unwrap(),
            user_desc.into_string().unwrap(),
        ],
        user,
    }
}
