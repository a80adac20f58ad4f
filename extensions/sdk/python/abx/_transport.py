"""Where the broker is and how bytes reach it: the local socket (found like the CLI finds
it, the daemon started through ``abx broker start`` when none answers) or, for
``host="ssh://[user@]host[:port]"`` / ``ABX_HOST``, the stdio of ``ssh host abx rpc``.

The ssh command is the CLI's (cli/client/src/remote.rs): ``ssh [-F $ABX_SSH_CONFIG]
[-p PORT] -T -o BatchMode=yes -- [user@]host $ABX_REMOTE_BIN rpc``, and its failures are
the same E-codes: E1014 unreachable, E1015 login refused, E1016 no remote ``abx``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import stat
import struct
import threading
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Tuple, Union

if TYPE_CHECKING:
    import subprocess

from .errors import AbxError, make_error

HOST_ENV = "ABX_HOST"
REMOTE_BIN_ENV = "ABX_REMOTE_BIN"
SSH_CONFIG_ENV = "ABX_SSH_CONFIG"
SSH_BIN_ENV = "ABX_SSH"


def _env(name: str) -> Optional[str]:
    v = os.environ.get(name)
    return v if v else None


class BrokerPaths(NamedTuple):
    """Where the daemon of this context's data dir lives, resolved from the environment as the
    CLI resolves it (broker/home/src/paths.rs ``Paths::from_env``)."""

    runtime_dir: str
    """``$ABX_HOME/run``; else ``$XDG_RUNTIME_DIR/abx`` when that variable is set, non-empty and
    a directory; else ``$TMPDIR/abx-<euid>/<data_key(data_dir)>`` (``TMPDIR`` as Rust's
    ``std::env::temp_dir`` takes it: ``/tmp`` when unset)."""
    data_dir: str
    """``$ABX_HOME/data``; else ``${XDG_DATA_HOME:-$HOME/.local/share}/abx``."""

    @property
    def socket(self) -> str:
        """The runtime dir's ``broker.sock``: the socket tried first."""
        return os.path.join(self.runtime_dir, "broker.sock")

    @property
    def runtime_lock(self) -> str:
        """The runtime dir's ``broker.lock``: the record of the daemon listening beside it."""
        return os.path.join(self.runtime_dir, "broker.lock")

    @property
    def data_lock(self) -> str:
        """The data dir's ``broker.lock``: the record of the daemon serving the data dir."""
        return os.path.join(self.data_dir, "broker.lock")


def data_key(data_dir: str) -> str:
    """The key of a data dir in the temp-dir fallback: the first 16 hex digits of the SHA-256 of
    its path as given, not resolved (``printf %s PATH | sha256sum | cut -c1-16``)."""
    return hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:16]


def broker_paths() -> BrokerPaths:
    """The runtime and data dirs of this process's environment (see :class:`BrokerPaths`)."""
    # os.path.join is POSIX join, as Rust's PathBuf::join: no normalization (the key hashes
    # the path's bytes, so it must be the string the daemon computes).
    home = _env("ABX_HOME")
    if home:
        return BrokerPaths(os.path.join(home, "run"), os.path.join(home, "data"))
    data_dir = os.path.join(_env("XDG_DATA_HOME") or os.path.join(_env("HOME") or "/", ".local/share"), "abx")
    xdg = _env("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        runtime_dir = os.path.join(xdg, "abx")
    else:
        # std::env::temp_dir: TMPDIR as set (even empty), else /tmp.
        tmp = os.environ.get("TMPDIR")
        runtime_dir = os.path.join("/tmp" if tmp is None else tmp, f"abx-{os.geteuid()}", data_key(data_dir))
    return BrokerPaths(runtime_dir, data_dir)


def socket_path() -> str:
    """The socket tried first: ``broker.sock`` in the runtime dir of :func:`broker_paths`
    (``$ABX_HOME/run``, else ``$XDG_RUNTIME_DIR/abx``, else ``$TMPDIR/abx-<uid>/<key>``). The
    daemon may listen elsewhere (started from a context with another runtime dir): see
    :func:`resolve_socket`."""
    return broker_paths().socket


class _Record(NamedTuple):
    """A daemon's ``broker.lock`` (broker/home/src/lock.rs ``Record``): ``pid``, ``version``,
    ``socket`` and ``data dir`` lines, complete lines only (an older daemon wrote fewer)."""

    pid: Optional[int]
    version: Optional[str]
    socket: Optional[bytes]
    data_dir: Optional[bytes]

    def serves(self, data_dir: str) -> bool:
        # A record without a data dir (an older daemon) is taken as serving it, as the CLI does.
        return self.data_dir is None or _same_path(self.data_dir, os.fsencode(data_dir))


def _u32(b: bytes) -> Optional[int]:
    """Rust's ``str::trim().parse::<u32>()``."""
    try:
        s = b.decode().strip()
    except UnicodeDecodeError:
        return None
    digits = s[1:] if s.startswith("+") else s
    if not digits or any(c not in "0123456789" for c in digits):
        return None
    n = int(digits)
    return n if n < 1 << 32 else None


def _read_record(path: str) -> Optional[_Record]:
    try:
        with open(path, "rb") as f:
            buf = f.read(16 << 10)
    except OSError:
        return None
    lines: List[bytes] = []
    for ln in buf.split(b"\n")[:-1]:  # the part after the last newline is not a complete line
        if not ln:
            break
        lines.append(ln)
    lines += [b""] * (4 - len(lines))
    pid = _u32(lines[0]) if lines[0] else None
    if pid is None and b"\n" not in buf:
        pid = _u32(buf)  # an older daemon's pid-only file had no newline
    if pid is None:
        return None
    try:
        version: Optional[str] = lines[1].decode() if lines[1] else None
    except UnicodeDecodeError:
        version = None
    return _Record(pid, version, lines[2] or None, lines[3] or None)


def _components(p: bytes) -> List[bytes]:
    """Rust's ``Path::components`` on Unix (what ``Path`` equality compares): repeated and
    trailing separators and inner ``.`` do not count."""
    absolute = p.startswith(b"/")
    out = [b"/"] if absolute else []
    for i, c in enumerate(p.split(b"/")):
        if not c or (c == b"." and (i > 0 or absolute)):
            continue
        out.append(c)
    return out


def _same_path(a: bytes, b: bytes) -> bool:
    return _components(a) == _components(b)


def _mine(p: bytes, kind: int) -> bool:
    """``p`` itself (not a symlink's target) is of ``kind`` (``stat.S_IFSOCK``/``S_IFDIR``)
    and belongs to this euid."""
    try:
        st = os.lstat(p)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and stat.S_IFMT(st.st_mode) == kind


def _recorded_elsewhere(p: BrokerPaths) -> Optional[bytes]:
    """The socket the data dir's record names (a daemon started from another context), when it
    is absolute and not the runtime socket, the ``broker.lock`` beside it names exactly this
    data dir, and the socket and its directory belong to this euid (cli/client/src/client.rs
    ``recorded_elsewhere``)."""
    r = _read_record(p.data_lock)
    if r is None or r.socket is None:
        return None
    sock = r.socket
    if not sock.startswith(b"/") or _same_path(sock, os.fsencode(p.socket)):
        return None
    comps = _components(sock)
    if len(comps) < 2:
        return None
    parent = b"/" + b"/".join(comps[1:-1])
    beside = _read_record(os.fsdecode(os.path.join(parent, b"broker.lock")))
    if beside is None or beside.data_dir is None or not _same_path(beside.data_dir, os.fsencode(p.data_dir)):
        return None
    return sock if _mine(sock, stat.S_IFSOCK) and _mine(parent, stat.S_IFDIR) else None


def _peer_uid(s: socket.socket, path: Union[str, bytes]) -> int:
    """The euid of the process behind a connected Unix socket (SO_PEERCRED; where Python has no
    such option, the owner of the socket file, which is whoever bound it)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is not None:
        _pid, uid, _gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
        return int(uid)
    return os.stat(path).st_uid


def _connect_checked(path: Union[str, bytes]) -> socket.socket:
    """Connect to ``path``; refuse a daemon that runs as another user."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        uid, me = _peer_uid(s, path), os.geteuid()
        if uid != me:
            raise PermissionError(errno.EACCES, f"{os.fsdecode(path)} is served by another user (uid {uid}), "
                                                f"not uid {me}")
    except BaseException:
        s.close()
        raise
    return s


def _connect_resolved(p: BrokerPaths) -> Tuple[socket.socket, str]:
    """A connection to the live daemon that serves ``p.data_dir``, without starting one
    (cli/client/src/client.rs ``connect_raw``): the runtime socket unless the record beside it
    names another data dir, else the socket recorded in the data dir. OSError when none."""
    r = _read_record(p.runtime_lock)
    first: OSError
    if r is not None and not r.serves(p.data_dir):
        first = FileNotFoundError(errno.ENOENT, f"the daemon on {p.socket} serves another data dir")
    else:
        try:
            return _connect_checked(p.socket), p.socket
        except OSError as e:
            first = e
    other = _recorded_elsewhere(p)
    if other is None:
        raise first
    return _connect_checked(other), os.fsdecode(other)


def abx_binary() -> str:
    """The ``abx`` CLI: ``ABX_BIN``, else ``abx`` on PATH."""
    import shutil

    b = _env("ABX_BIN") or shutil.which("abx")
    if not b:
        raise make_error(
            "E1007",
            "The abx broker is not reachable: no daemon answers and the 'abx' binary is not on PATH.",
            "Install abx (it starts the daemon), or set ABX_BIN to its path.",
        )
    return b


def start_daemon() -> None:
    """``abx broker start``: one daemon even when many clients start it at once (it locks)."""
    import subprocess

    try:
        p = subprocess.run(
            [abx_binary(), "-j", "broker", "start"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise make_error("E1007", f"The abx broker is not reachable: cannot run 'abx broker start': {e}",
                         "Run 'abx broker start' by hand and see its log.") from None
    if p.returncode != 0:
        try:
            v = json.loads(p.stdout)
        except ValueError:
            v = None
        if isinstance(v, dict) and isinstance(v.get("code"), str):
            raise make_error(v["code"], str(v.get("message", "")), str(v.get("suggestion", "")))
        raise make_error("E1007", "The abx broker is not reachable: 'abx broker start' failed: "
                         + (p.stderr or p.stdout).decode(errors="replace").strip(),
                         "Run 'abx broker start' by hand and see its log.")


def _connect(start: bool) -> Tuple[socket.socket, str]:
    p = broker_paths()
    try:
        return _connect_resolved(p)
    except OSError as e:
        if not start:
            raise make_error("E1007", f"The abx broker is not reachable: no daemon serving {p.data_dir} answers "
                                      f"({p.socket}: {e})",
                             "Run 'abx broker start' and see the log under the broker's data dir.") from None
    start_daemon()
    p = broker_paths()
    try:
        return _connect_resolved(p)
    except OSError as e:
        raise make_error("E1007", f"The abx broker is not reachable: started, but no daemon serving {p.data_dir} "
                                  f"answers ({p.socket}: {e})",
                         "Run 'abx broker status' and see the log under the broker's data dir.") from None


def connect_socket(start: bool = True) -> socket.socket:
    """A connected Unix socket to the daemon that serves this context's data dir, found as
    :func:`resolve_socket` finds it; when none answers, ``abx broker start`` (``start=False``:
    E1007 instead) and once more."""
    return _connect(start)[0]


def resolve_socket() -> Optional[str]:
    """The socket of the live daemon that serves this context's data dir, found as the CLI finds
    it (cli/client/src/client.rs ``connect_raw``), so that a process without
    ``XDG_RUNTIME_DIR`` (cron, ssh, an MCP host passing only ``HOME``) reaches the daemon a shell
    with it started, and the reverse:

    1. :func:`socket_path`, unless the ``broker.lock`` beside it names another data dir;
    2. else the socket named in the data dir's ``broker.lock``, if it is absolute, the
       ``broker.lock`` beside it names exactly this data dir, and the socket and its directory
       belong to this user.

    The daemon behind it must run as this user. ``None`` when no such daemon answers (nothing
    is started: :func:`connect_socket` starts one)."""
    try:
        s, path = _connect_resolved(broker_paths())
    except OSError:
        return None
    s.close()
    return path


class Host:
    """A parsed ``ssh://[user@]host[:port]``."""

    def __init__(self, url: str, user: Optional[str], host: str, port: Optional[int]) -> None:
        self.url, self.user, self.host, self.port = url, user, host, port

    def __repr__(self) -> str:
        return f"Host({self.url!r})"

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    @staticmethod
    def remote_bin() -> str:
        return _env(REMOTE_BIN_ENV) or "abx"

    def ssh_argv(self, args: List[str]) -> List[str]:
        argv = [_env(SSH_BIN_ENV) or "ssh"]
        cfg = _env(SSH_CONFIG_ENV)
        if cfg:
            argv += ["-F", cfg]
        if self.port:
            argv += ["-p", str(self.port)]
        argv += ["-T", "-o", "BatchMode=yes", "--", self.target]
        import shlex

        argv += [shlex.quote(a) for a in [self.remote_bin(), *args]]
        return argv

    def check_command(self) -> str:
        """The ssh command to try by hand, as the SDK runs it (ABX_SSH_CONFIG, the port,
        ``-T -o BatchMode=yes``): ``ssh -p 2222 -T -o BatchMode=yes -- root@127.0.0.1 true``."""
        import shlex

        argv = self.ssh_argv([])[:-1] + ["true"]
        return " ".join(shlex.quote(a) for a in argv)

    def classify(self, status: Optional[int], stderr: str) -> Optional[AbxError]:
        """ssh's failure as E1014 / E1015 / E1016 (None: ssh worked, the remote command failed)."""
        lines = [ln.strip() for ln in stderr.splitlines()
                 if ln.strip() and not ln.startswith("Warning: Permanently added")]
        detail = " | ".join(lines[-3:]) or (f"ssh exited with status {status}" if status is not None
                                             else "ssh ended without a word")
        low = stderr.lower()
        args = dict(host=self.url, target=self.target, detail=detail, bin=self.remote_bin(),
                    check=self.check_command())
        if status == 255:
            if any(a in low for a in ("permission denied", "host key verification failed",
                                      "too many authentication failures", "no matching host key",
                                      "authentication failed")):
                return make_error(
                    "E1015", "ssh could not log in to '{host}': {detail}".format(**args),
                    "abx runs your own ssh without prompting (BatchMode): load the key in ssh-agent or name it "
                    "in ~/.ssh/config (IdentityFile), accept the host key once with '{check}', "
                    "then retry.".format(**args))
            return make_error(
                "E1014", "Cannot reach host '{host}' over ssh: {detail}".format(**args),
                "Check the address and port in ABX_HOST / --host (ssh://[user@]host[:port]) and that sshd "
                "runs there; '{check}' must work by hand.".format(**args))
        if status in (126, 127) or any(m in low for m in ("command not found", ": not found",
                                                          "no such file or directory")):
            return make_error(
                "E1016", "'{bin}' cannot be run on host '{host}': {detail}".format(**args),
                "Install abx on that machine so '{bin}' is on the PATH of non-interactive ssh sessions, "
                "or set ABX_REMOTE_BIN to its full path there.".format(**args))
        return None


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:%-")


def _ok(s: str) -> bool:
    return bool(s) and not s.startswith("-") and all(c in _NAME_CHARS for c in s)


def parse_host(s: Optional[str]) -> Optional[Host]:
    """``ssh://[user@]host[:port]`` (None or "" is this machine); E1009 when malformed."""
    if s is None:
        s = os.environ.get(HOST_ENV, "")
    s = s.strip()
    if not s:
        return None

    def bad(why: str) -> AbxError:
        return make_error("E1009", f"Invalid host '{s}': {why}.",
                          "Give ABX_HOST / host= as ssh://[user@]host[:port] (an empty value means this machine).")

    if not s.startswith("ssh://"):
        raise bad("only ssh:// hosts are supported")
    rest = s[len("ssh://"):].rstrip("/")
    user, _, hostport = rest.rpartition("@")
    port: Optional[str] = None
    if hostport.startswith("["):
        h, sep, after = hostport[1:].partition("]")
        if not sep:
            raise bad("unclosed '['")
        if after.startswith(":"):
            port = after[1:]
        elif after:
            raise bad("junk after ']'")
        host = h
    else:
        host, sep, p = hostport.rpartition(":")
        if sep:
            port = p
        else:
            host = hostport
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise bad("the port is not a number from 1 to 65535")
    if not _ok(host):
        raise bad("no valid host name")
    if user and not _ok(user):
        raise bad("no valid user name")
    if "@" in s[len("ssh://"):] and not user:
        raise bad("no valid user name")
    return Host(url=s, user=user or None, host=host, port=int(port) if port else None)


class SshProcess:
    """The ``ssh host abx rpc`` child: stdin/stdout are the connection, stderr is kept (its
    tail) to explain a failure."""

    def __init__(self, host: Host) -> None:
        import subprocess

        self.host = host
        try:
            self.proc = subprocess.Popen(
                host.ssh_argv(["rpc"]),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
            )
        except OSError as e:
            raise make_error("E1014", f"Cannot reach host '{host.url}' over ssh: cannot run ssh: {e}",
                             "Install an OpenSSH client, or set ABX_SSH to the ssh binary.") from None
        self._stderr = bytearray()
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        while True:
            b = self.proc.stderr.read(4096)
            if not b:
                return
            self._stderr += b
            del self._stderr[:-8192]

    def failure(self) -> AbxError:
        """Why the connection ended (waits up to 10 s for ssh to exit)."""
        import subprocess

        try:
            status: Optional[int] = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        self._t.join(timeout=5)
        err = self._stderr.decode(errors="replace")
        e = self.host.classify(status, err)
        if e is not None:
            return e
        tail = " | ".join([ln for ln in err.splitlines() if ln.strip()][-3:])
        return make_error("E1007", f"The abx broker is not reachable: the remote '{self.host.remote_bin()} rpc' "
                                   f"on '{self.host.url}' ended (exit {status})" + (f": {tail}" if tail else ""),
                          "See the broker log on that machine.")

    def close(self) -> None:
        import subprocess

        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
