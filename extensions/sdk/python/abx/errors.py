"""Exceptions: one class per E-code family of the broker (docs/design.md#errors), and named classes for
the codes callers branch on.

Every exception carries ``code`` (``"E2009"``), ``number`` (2009), ``message``, ``suggestion``
and ``data`` (the reply's ``error.data``). ``str(e)`` reads like the CLI:
``[E2009] Sandbox 'x' not found.`` and ``  Suggestion: ...`` on the next line.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class AbxError(Exception):
    """Base of every error the SDK raises for the broker, its connection or its providers."""

    code: str = "E9001"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        suggestion: str = "",
        data: Optional[Dict[str, Any]] = None,
        rpc_code: Optional[int] = None,
    ) -> None:
        if code is not None:
            self.code = code
        self.message = message
        self.suggestion = suggestion
        self.data: Dict[str, Any] = dict(data or {})
        self.rpc_code = rpc_code
        super().__init__(message)

    @property
    def number(self) -> int:
        """The E-number, e.g. 2009."""
        try:
            return int(self.code.lstrip("E"))
        except ValueError:
            return 0

    def __str__(self) -> str:
        s = f"[{self.code}] {self.message}"
        if self.suggestion:
            s += f"\n  Suggestion: {self.suggestion}"
        return s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"


# E1xxx: wire, usage and the connection.
class WireError(AbxError):
    """E1xxx: the request itself, the connection or the daemon."""


class ParseError(WireError):
    """E1001: the bytes were not JSON."""


class InvalidRequestError(WireError):
    """E1002: not a valid JSON-RPC 2.0 request."""


class MethodNotFoundError(WireError):
    """E1003: no such method."""


class InvalidParamsError(WireError):
    """E1004: params missing, of the wrong type or out of range."""


class MessageTooLargeError(WireError):
    """E1005: a message above the size limit."""


class RequestCancelledError(WireError):
    """E1006: the request was cancelled (``$/cancelRequest``)."""


class BrokerUnreachableError(WireError):
    """E1007: the daemon could not be reached or started (or the connection broke)."""


class VersionMismatchError(WireError):
    """E1008: client and daemon versions differ."""


class UsageError(WireError):
    """E1009: wrong usage or an action refused before it reached the broker."""


class ShuttingDownError(WireError):
    """E1010: the broker is shutting down."""


class PermissionDeniedError(WireError):
    """E1011: the broker refused this user."""


class BrokerAlreadyRunningError(WireError):
    """E1012: a daemon already owns the socket."""


class BusyError(WireError):
    """E1013: the broker is busy."""


class HostUnreachableError(BrokerUnreachableError):
    """E1014: ssh could not reach the host of ``host=`` / ``ABX_HOST``."""


class HostAuthError(BrokerUnreachableError):
    """E1015: ssh reached the host but the login was refused."""


class RemoteAbxNotFoundError(BrokerUnreachableError):
    """E1016: logged in, but the remote ``abx`` (``ABX_REMOTE_BIN``) could not be run."""


# E2xxx: sandboxes.
class SandboxError(AbxError):
    """E2xxx: sandboxes."""


class SandboxCreateError(SandboxError):
    """E2001: the sandbox could not be created."""


class SandboxNotRunningError(SandboxError):
    """E2002: the sandbox is paused or stopping."""


class SandboxExpiredError(SandboxError):
    """E2003: the sandbox's lifetime ran out."""


class InvalidTimeoutError(SandboxError):
    """E2004: a timeout outside 1..2592000 s."""


class TemplateNotFoundError(SandboxError):
    """E2005: the template is unknown to the provider."""


class SandboxLimitError(SandboxError):
    """E2006: the cap on live sandboxes is reached."""


class SandboxNotFoundError(SandboxError):
    """E2009: no sandbox with this id."""


class MountRefusedError(SandboxError):
    """E2010: a mount the sandbox may not have (or no longer the directory it mounted)."""


# E3xxx: exec and processes.
class ExecError(AbxError):
    """E3xxx: exec and processes."""


class ExecTimeoutError(ExecError):
    """E3001: the command timed out."""


class ExecNotFoundError(ExecError):
    """E3002: the exec id is unknown."""


class ExecStartError(ExecError):
    """E3003: the command failed to start."""


class ExecNotOwnedError(ExecError):
    """E3004: another connection owns this exec."""


class ExecStdinClosedError(ExecError):
    """E3005: stdin of the exec is closed."""


class ProcessNotFoundError(ExecError):
    """E3006: the pid is not the sandbox's."""


# E4xxx: files.
class FilesError(AbxError):
    """E4xxx: files."""


class SandboxFileNotFoundError(FilesError):
    """E4001: no such file in the sandbox."""


class PathOutsideSandboxError(FilesError):
    """E4002: the path leaves the sandbox."""


class IsADirectoryError_(FilesError):  # noqa: N801 (the builtin's name is taken)
    """E4003: the path is a directory."""


class NotADirectoryError_(FilesError):  # noqa: N801
    """E4004: the path is not a directory."""


class DirectoryNotEmptyError(FilesError):
    """E4005: the directory is not empty."""


class FileExistsError_(FilesError):  # noqa: N801
    """E4006: the path exists."""


class ReadOnlyError(FilesError):
    """E4014: a path the sandbox sees but may not change (a system directory, an ``ro`` mount)."""


class ApplyConflictError(FilesError):
    """E4015: host files changed since the sandbox was created (``apply``)."""


# E5xxx: ports.
class PortsError(AbxError):
    """E5xxx: ports."""


# E8xxx: providers.
class ProviderError(AbxError):
    """E8xxx: providers and plugins."""


class ProviderNotInstalledError(ProviderError):
    """E8001: the provider is not installed."""


class PluginError(ProviderError):
    """E8002, E8003, E8007, E8008, E8009: the plugin failed (handshake, protocol, crash, timeout, reply)."""


class FeatureNotSupportedError(ProviderError):
    """E8004: the provider does not declare the feature this call needs."""


class ProviderConfigError(ProviderError):
    """E8006: the provider's config is invalid."""


class SourceUnreachableError(ProviderError):
    """E8010: the install source cannot be reached."""


class IntegrityError(ProviderError):
    """E8011: the installed plugin's files changed."""


class RefusedError(ProviderError):
    """E8012: confirmation, pin or transport refused (the message says what to pass)."""


class DigestMismatchError(ProviderError):
    """E8013: the archive's digest is not the one given."""


class InvalidManifestError(ProviderError):
    """E8014: the manifest is invalid."""


class AlreadyInstalledError(ProviderError):
    """E8015: the provider is already installed."""


class EnforcementUnavailableError(ProviderError):
    """E8016: the declared security cannot be enforced here."""


# E9xxx: internal.
class InternalError(AbxError):
    """E9xxx: a bug in the broker (it is logged there)."""


_BY_CODE: Dict[str, Type[AbxError]] = {
    "E1001": ParseError,
    "E1002": InvalidRequestError,
    "E1003": MethodNotFoundError,
    "E1004": InvalidParamsError,
    "E1005": MessageTooLargeError,
    "E1006": RequestCancelledError,
    "E1007": BrokerUnreachableError,
    "E1008": VersionMismatchError,
    "E1009": UsageError,
    "E1010": ShuttingDownError,
    "E1011": PermissionDeniedError,
    "E1012": BrokerAlreadyRunningError,
    "E1013": BusyError,
    "E1014": HostUnreachableError,
    "E1015": HostAuthError,
    "E1016": RemoteAbxNotFoundError,
    "E2001": SandboxCreateError,
    "E2002": SandboxNotRunningError,
    "E2003": SandboxExpiredError,
    "E2004": InvalidTimeoutError,
    "E2005": TemplateNotFoundError,
    "E2006": SandboxLimitError,
    "E2009": SandboxNotFoundError,
    "E2010": MountRefusedError,
    "E3001": ExecTimeoutError,
    "E3002": ExecNotFoundError,
    "E3003": ExecStartError,
    "E3004": ExecNotOwnedError,
    "E3005": ExecStdinClosedError,
    "E3006": ProcessNotFoundError,
    "E4001": SandboxFileNotFoundError,
    "E4002": PathOutsideSandboxError,
    "E4003": IsADirectoryError_,
    "E4004": NotADirectoryError_,
    "E4005": DirectoryNotEmptyError,
    "E4006": FileExistsError_,
    "E4014": ReadOnlyError,
    "E4015": ApplyConflictError,
    "E8001": ProviderNotInstalledError,
    "E8002": PluginError,
    "E8003": PluginError,
    "E8004": FeatureNotSupportedError,
    "E8006": ProviderConfigError,
    "E8007": PluginError,
    "E8008": PluginError,
    "E8009": PluginError,
    "E8010": SourceUnreachableError,
    "E8011": IntegrityError,
    "E8012": RefusedError,
    "E8013": DigestMismatchError,
    "E8014": InvalidManifestError,
    "E8015": AlreadyInstalledError,
    "E8016": EnforcementUnavailableError,
}

_BY_FAMILY: Dict[str, Type[AbxError]] = {
    "1": WireError,
    "2": SandboxError,
    "3": ExecError,
    "4": FilesError,
    "5": PortsError,
    "8": ProviderError,
    "9": InternalError,
}

# JSON-RPC codes without an abx code (a peer that is not the broker).
_BY_RPC = {-32700: "E1001", -32600: "E1002", -32601: "E1003", -32602: "E1004", -32800: "E1006"}


def error_class(code: str) -> Type[AbxError]:
    """The exception class for an E-code (its own class, else its family's)."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls
    return _BY_FAMILY.get(code[1:2], AbxError) if code.startswith("E") else AbxError


def make_error(code: str, message: str, suggestion: str = "", data: Optional[Dict[str, Any]] = None,
               rpc_code: Optional[int] = None) -> AbxError:
    """An exception of the right class for ``code``."""
    return error_class(code)(message, code=code, suggestion=suggestion, data=data, rpc_code=rpc_code)


def from_rpc(err: Dict[str, Any]) -> AbxError:
    """The exception for a JSON-RPC ``error`` object."""
    data = err.get("data") if isinstance(err.get("data"), dict) else {}
    rpc_code = err.get("code") if isinstance(err.get("code"), int) else None
    code = data.get("abx") if isinstance(data.get("abx"), str) else None
    if code is None:
        code = _BY_RPC.get(rpc_code or 0, f"E{rpc_code}" if rpc_code and rpc_code > 0 else "E9001")
    return make_error(code, str(err.get("message", "")), str(data.get("suggestion", "")), data, rpc_code)


__all__ = [n for n, v in list(globals().items()) if isinstance(v, type) and issubclass(v, AbxError)] + [
    "error_class",
    "make_error",
    "from_rpc",
]
