//! Connects to a socket, sends one `broker/ping` and prints the reply or `EOF`.
//! Used by the test that connects as another uid.
use std::io::{BufRead, BufReader, Write};

fn main() {
    let path = std::env::args().nth(1).expect("socket path");
    let mut s = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            println!("CONNECT-ERROR {e}");
            return;
        }
    };
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let _ = s.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"broker/ping\"}\n");
    let mut line = String::new();
    match BufReader::new(s).read_line(&mut line) {
        Ok(0) | Err(_) => println!("EOF"),
        Ok(_) => print!("{line}"),
    }
}
