"""Where the broker is and how bytes reach it: the local socket (found like the CLI finds
it, the daemon started through ``abx broker start`` when none answers) or, for
``host="ssh://[user@]host[:port]"`` / ``ABX_HOST``, the stdio of ``ssh host abx rpc``.

The ssh command is the CLI's (cli/client/src/remote.rs): ``ssh [-F $ABX_SSH_CONFIG]
[-p PORT] -T -o BatchMode=yes -- [user@]host $ABX_REMOTE_BIN rpc``, and its failures are
the same E-codes: E1014 unreachable, E1015 login refused, E1016 no remote ``abx``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import TYPE_CHECKING, List, Optional

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


def socket_path() -> str:
    """The daemon socket, resolved as the CLI does (broker/home/src/paths.rs): ``$ABX_HOME/run``,
    else ``$XDG_RUNTIME_DIR/abx``, else ``$TMPDIR/abx-<uid>`` (``/tmp`` by default)."""
    home = _env("ABX_HOME")
    if home:
        return os.path.join(home, "run", "broker.sock")
    xdg = _env("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "abx", "broker.sock")
    return os.path.join(_env("TMPDIR") or "/tmp", f"abx-{os.geteuid()}", "broker.sock")


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


def connect_socket(start: bool = True) -> socket.socket:
    """A connected Unix socket to the daemon, starting it when none answers."""
    path = socket_path()
    for attempt in (0, 1):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError as e:
            s.close()
            if attempt or not start:
                raise make_error("E1007", f"The abx broker is not reachable: {path}: {e}",
                                 "Run 'abx broker start' and see the log under the broker's data dir.") from None
        start_daemon()
    raise AssertionError("unreachable")


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

    def classify(self, status: Optional[int], stderr: str) -> Optional[AbxError]:
        """ssh's failure as E1014 / E1015 / E1016 (None: ssh worked, the remote command failed)."""
        lines = [ln.strip() for ln in stderr.splitlines()
                 if ln.strip() and not ln.startswith("Warning: Permanently added")]
        detail = " | ".join(lines[-3:]) or (f"ssh exited with status {status}" if status is not None
                                             else "ssh ended without a word")
        low = stderr.lower()
        args = dict(host=self.url, target=self.target, detail=detail, bin=self.remote_bin())
        if status == 255:
            if any(a in low for a in ("permission denied", "host key verification failed",
                                      "too many authentication failures", "no matching host key",
                                      "authentication failed")):
                return make_error(
                    "E1015", "ssh could not log in to '{host}': {detail}".format(**args),
                    "abx runs your own ssh without prompting (BatchMode): load the key in ssh-agent or name it "
                    "in ~/.ssh/config (IdentityFile), accept the host key once with 'ssh {target} true', "
                    "then retry.".format(**args))
            return make_error(
                "E1014", "Cannot reach host '{host}' over ssh: {detail}".format(**args),
                "Check the address and port in ABX_HOST / --host (ssh://[user@]host[:port]) and that sshd "
                "runs there; 'ssh {target} true' must work by hand.".format(**args))
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
