"""abx: drive code sandboxes of any provider through the abx broker.

Sync::

    from abx import Sandbox
    sb = Sandbox.create(provider="local")
    print(sb.exec("echo hi").stdout)
    sb.kill()

asyncio: ``from abx import AsyncSandbox`` (or ``abx.aio``). Providers: ``abx.providers``.
Errors: :class:`AbxError` and its subclasses (``abx.errors``). ``host="ssh://user@host"``
(or ``ABX_HOST``) reaches a broker on another machine over ssh. Where the local daemon is:
:func:`socket_path` (the socket tried first) and :func:`resolve_socket` (the live daemon's).
"""

from typing import Any

from . import errors, providers
from ._conn import Connection, RequestTimeoutError, default_connection
from ._transport import resolve_socket, socket_path
from ._types import CodeOutput, CodeResult, ExecExit, ExecOutput, ExecResult, FileChange, Record, SandboxInfo, SandboxList
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .sandbox import ExecStream, Files, Ports, Processes, Sandbox, Watch

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The asyncio API is imported on first use: a sync script does not pay for asyncio.
    if name in ("aio", "AsyncSandbox", "AsyncConnection"):
        import importlib

        aio = importlib.import_module(".aio", __name__)
        return aio if name == "aio" else getattr(aio, name)
    raise AttributeError(f"module 'abx' has no attribute {name!r}")


__all__ = [
    "Sandbox", "AsyncSandbox", "Connection", "AsyncConnection", "default_connection", "ExecStream", "Watch",
    "Files", "Processes", "Ports", "ExecResult", "ExecOutput", "ExecExit", "FileChange", "Record", "SandboxInfo",
    "SandboxList", "CodeResult", "CodeOutput", "RequestTimeoutError", "aio", "errors", "providers", "socket_path", "resolve_socket",
    *_errors_all,
]
