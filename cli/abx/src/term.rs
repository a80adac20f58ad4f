//! Terminal plumbing: is a stream a terminal, its size, raw mode, a `[y/N]` prompt on the
//! controlling terminal, and a stdin reader thread that never blocks the runtime's exit.

use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsRawFd;

/// True when stdout is a terminal.
pub fn stdout_is_tty() -> bool {
    std::io::stdout().is_terminal()
}

/// True when stderr is a terminal.
pub fn stderr_is_tty() -> bool {
    std::io::stderr().is_terminal()
}

/// True when stdin is a terminal.
pub fn stdin_is_tty() -> bool {
    std::io::stdin().is_terminal()
}

/// The size (cols, rows) of the terminal on `fd`, when it is one with a known size.
pub fn size_of(fd: i32) -> Option<(u16, u16)> {
    // SAFETY: TIOCGWINSZ fills a winsize; fd is only borrowed.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}

/// The width tables may use: the terminal's width when stdout is a terminal, else `None`
/// (unlimited: content is never cut when piped).
pub fn table_width() -> Option<usize> {
    if !stdout_is_tty() {
        return None;
    }
    Some(
        size_of(1)
            .map(|(c, _)| c as usize)
            .or_else(|| std::env::var("COLUMNS").ok()?.parse().ok())
            .unwrap_or(80),
    )
}

/// The pty size for `abx shell`: the terminal's (stdin, then stdout), else 80x24.
pub fn pty_size() -> (u16, u16) {
    size_of(0).or_else(|| size_of(1)).unwrap_or((80, 24))
}

/// Raw mode on stdin for as long as the guard lives; the previous settings come back on
/// drop (also on an error path or a panic unwinding through the owner).
pub struct RawMode {
    saved: libc::termios,
}

impl RawMode {
    /// Switch stdin to raw mode; `None` when stdin is not a terminal.
    pub fn enable() -> Option<RawMode> {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: plain termios calls on our own stdin.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(fd, &mut t) != 0 {
                return None;
            }
            let saved = t;
            libc::cfmakeraw(&mut t);
            if libc::tcsetattr(fd, libc::TCSANOW, &t) != 0 {
                return None;
            }
            Some(RawMode { saved })
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: restores what tcgetattr returned.
        unsafe {
            libc::tcsetattr(fd, libc::TCSADRAIN, &self.saved);
        }
    }
}

/// Ask `question [y/N]: ` on the controlling terminal and read the answer there.
/// `None` when there is no terminal to ask on.
pub fn confirm(question: &str) -> Option<bool> {
    let mut tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    write!(tty, "{question} [y/N]: ").ok()?;
    tty.flush().ok()?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match tty.read(&mut b) {
            Ok(0) => break,
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let answer = String::from_utf8_lossy(&line).trim().to_ascii_lowercase();
    Some(matches!(answer.as_str(), "y" | "yes"))
}

/// Read stdin on a plain thread and hand the chunks over a channel; `None` marks the end
/// (EOF or an error). A thread, not `tokio::io::stdin`, so a read that never returns (an
/// idle terminal or pipe) cannot hold up the exit.
pub fn stdin_chunks() -> tokio::sync::mpsc::Receiver<Option<Vec<u8>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.blocking_send(None);
    });
    rx
}
