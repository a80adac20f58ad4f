"""A throwaway sshd on a loopback port for the SSH tests (Debian's openssh-server): its own
host key, a user key in AuthorizedKeysFile, the same user (root in CI: PermitRootLogin),
and ``SetEnv ABX_HOME=...`` so the broker reached over ssh is a separate one, as on another
machine. The client side is an ssh config file (``ABX_SSH_CONFIG``, passed as ``ssh -F``)
naming the key and a private known_hosts."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def missing() -> Optional[str]:
    if SSHD is None:
        return "sshd is not installed (apt-get install openssh-server; scripts/test installs it)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the OpenSSH client is not installed"
    return None


class Sshd:
    def __init__(self, d: Path) -> None:
        self.dir = d
        self.remote_home = d / "remote-home"
        self.remote_home.mkdir()
        for k in ("host", "user", "wrong"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / k)], check=True)
        shutil.copy(d / "user.pub", d / "authorized_keys")
        self.port = free_port()
        self.user = getpass.getuser()
        (d / "sshd_config").write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n"
            "StrictModes no\nPermitRootLogin yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"UsePAM no\nPidFile none\nSetEnv ABX_HOME={self.remote_home}\n")
        self.config = self.client_config("user")
        self.wrong_config = self.client_config("wrong")
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        self.log = open(d / "sshd.log", "wb")
        self.proc = subprocess.Popen([SSHD, "-f", str(d / "sshd_config"), "-D", "-e"], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"sshd did not start: {(d / 'sshd.log').read_text()}")
                time.sleep(0.02)
        self.url = f"ssh://{self.user}@127.0.0.1:{self.port}"

    def client_config(self, key: str) -> str:
        p = self.dir / f"ssh_config_{key}"
        p.write_text(f"Host *\n  IdentityFile {self.dir}/{key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
                     f"  UserKnownHostsFile {self.dir}/known_hosts\n  LogLevel ERROR\n")
        return str(p)

    def stop(self, abx: str) -> None:
        subprocess.run([abx, "broker", "stop"], env={**os.environ, "ABX_HOME": str(self.remote_home)},
                       capture_output=True, timeout=60)
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()
