//! Signals as the API names them (`exec/kill {signal}`, `process/kill`) and the escalation of
//! a kill the command may ignore, shared by every provider.

use std::time::Duration;

/// A signal by name or number: `TERM`, `SIGTERM`, `term`, `9`, `KILL`, `INT`, `HUP`, `STOP`,
/// `CONT`, `USR1`, `USR2`, `QUIT`, `TSTP`, `ALRM`, `WINCH`, `ABRT`, `PIPE`.
pub fn signal_from_name(name: &str) -> Option<i32> {
    let n = name.trim();
    if let Ok(num) = n.parse::<i32>() {
        return (1..=libc::SIGRTMAX()).contains(&num).then_some(num);
    }
    let upper = n.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    Some(match bare {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "ABRT" => libc::SIGABRT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "PIPE" => libc::SIGPIPE,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "TSTP" => libc::SIGTSTP,
        "WINCH" => libc::SIGWINCH,
        _ => return None,
    })
}

/// `SIGKILL` for 9, etc.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGALRM => "SIGALRM",
        _ => return format!("SIG{sig}"),
    };
    name.to_owned()
}

/// Grace periods of an escalating `exec/kill`: INT, then TERM after [`KILL_GRACE`], then
/// KILL after another one, while the command's process has not ended.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// The signals that follow `sig`, [`KILL_GRACE`] apart, while the command runs.
pub fn escalation(sig: i32) -> &'static [i32] {
    match sig {
        libc::SIGINT => &[libc::SIGTERM, libc::SIGKILL],
        libc::SIGTERM | libc::SIGHUP | libc::SIGQUIT => &[libc::SIGKILL],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names() {
        assert_eq!(signal_from_name("TERM"), Some(libc::SIGTERM));
        assert_eq!(signal_from_name("SIGTERM"), Some(libc::SIGTERM));
        assert_eq!(signal_from_name("sigterm"), Some(libc::SIGTERM));
        assert_eq!(signal_from_name("9"), Some(libc::SIGKILL));
        assert_eq!(signal_from_name("KILL"), Some(libc::SIGKILL));
        assert_eq!(signal_from_name("INT"), Some(libc::SIGINT));
        assert_eq!(signal_from_name("HUP"), Some(libc::SIGHUP));
        assert_eq!(signal_from_name("STOP"), Some(libc::SIGSTOP));
        assert_eq!(signal_from_name("CONT"), Some(libc::SIGCONT));
        assert_eq!(signal_from_name("USR1"), Some(libc::SIGUSR1));
        assert_eq!(signal_from_name("USR2"), Some(libc::SIGUSR2));
        assert_eq!(signal_from_name("QUIT"), Some(libc::SIGQUIT));
        assert_eq!(signal_from_name("0"), None);
        assert_eq!(signal_from_name("999"), None);
        assert_eq!(signal_from_name("BOGUS"), None);
        assert_eq!(signal_from_name(""), None);
    }
}
