"""E2B's SDK surface on the abx broker: code written for ``e2b`` (2.63.0) runs on ``local``
(or any provider) by changing its import.

    from abx.e2b import Sandbox                      # was: from e2b import Sandbox
    from abx.e2b.code_interpreter import Sandbox     # was: from e2b_code_interpreter import Sandbox

The mapping, member by member, is in the SDK's README ("E2B compatibility"). What has no
counterpart raises :class:`NotSupportedException` naming the nearest abx call.
"""

from ._models import (
    AuthenticationException, BuildException, CommandExitException, CommandResult, EntryInfo, FileNotFoundException,
    FilesystemEvent, FilesystemEventType, FileType, FileUploadException, GitAuthException, GitUpstreamException,
    GuestUnresponsiveException, InvalidArgumentException, NotEnoughSpaceException, NotFoundException,
    NotSupportedException, ProcessInfo, PtyOutput, PtySize, RateLimitException, SandboxException, SandboxInfo,
    SandboxNotFoundException, SandboxNotRunningException, SandboxQuery, SandboxState, SandboxUnreachableException,
    SecretException, SecretNotFoundException, ServiceBusyException, Stderr, Stdout, TemplateException,
    TimeoutException, VolumeException, VolumeNotFoundException, VolumePathNotFoundException, WriteInfo,
)
from ._sync import CommandHandle, Commands, Filesystem, Sandbox, SandboxPaginator, WatchHandle

#: The E2B releases this surface mirrors.
E2B_VERSION = "2.63.0"
E2B_CODE_INTERPRETER_VERSION = "2.11.5"

__all__ = [
    "Sandbox", "AsyncSandbox", "Commands", "AsyncCommands", "CommandHandle", "AsyncCommandHandle", "CommandResult",
    "CommandExitException", "Filesystem", "AsyncFilesystem", "WatchHandle", "AsyncWatchHandle", "EntryInfo",
    "WriteInfo", "FileType", "FilesystemEvent", "FilesystemEventType", "ProcessInfo", "PtySize", "PtyOutput",
    "Stdout", "Stderr", "SandboxInfo", "SandboxQuery", "SandboxState", "SandboxPaginator", "AsyncSandboxPaginator",
    "SandboxException", "TimeoutException", "InvalidArgumentException", "NotEnoughSpaceException",
    "NotFoundException", "FileNotFoundException", "SandboxNotFoundException", "AuthenticationException",
    "TemplateException", "RateLimitException", "BuildException", "FileUploadException", "GitAuthException",
    "GitUpstreamException", "SandboxNotRunningException", "SandboxUnreachableException",
    "GuestUnresponsiveException", "ServiceBusyException", "VolumeException", "VolumeNotFoundException",
    "VolumePathNotFoundException", "SecretException", "SecretNotFoundException", "NotSupportedException",
    "E2B_VERSION", "E2B_CODE_INTERPRETER_VERSION",
]

from typing import Any as _Any, Callable as _Callable, Dict as _Dict, Literal as _Literal, Union as _Union

from ._models import unsupported as _unsupported  # noqa: E402

OutputHandler = _Callable[[_Any], _Any]
Username = _Literal["root", "user"]
WriteData = _Union[str, bytes, _Any]
AsyncWriteData = _Union[str, bytes, _Any]
SandboxListOrder = _Literal["asc", "desc"]
#: E2B's "every address" network selector (``network={"deny_out": [ALL_TRAFFIC]}``: no network).
ALL_TRAFFIC = "0.0.0.0/0"

_TEMPLATES = "abx template pull/import (an OCI image) and Sandbox.create(template=IMAGE)"
_NEAREST: _Dict[str, str] = {
    **dict.fromkeys(["Template", "AsyncTemplate", "TemplateBase", "TemplateClass", "ReadyCmd", "wait_for_file",
                     "wait_for_port", "wait_for_process", "wait_for_timeout", "wait_for_url", "default_build_logger",
                     "LogEntry", "LogEntryEnd", "LogEntryLevel", "LogEntryStart", "BuildInfo", "BuildStatusReason",
                     "TemplateBuildStatus", "TemplateBuildStatusResponse", "TemplateTag", "TemplateTagInfo",
                     "CopyItem", "DockerfileSyntaxError"], _TEMPLATES),
    **dict.fromkeys(["Volume", "AsyncVolume", "VolumeAndToken", "VolumeApiParams", "VolumeConnectionConfig",
                     "VolumeEntryStat", "VolumeFileType", "VolumeInfo"],
                    "abx.Sandbox.create(mounts=['/host/dir:/workspace/x:rw']) (host directories in the sandbox)"),
    **dict.fromkeys(["Secret", "AsyncSecret", "SecretInfo", "SecretPaginator", "AsyncSecretPaginator",
                     "SandboxIamOpts", "SandboxIamToken", "SandboxIamTokenType"],
                    "Sandbox.create(envs={...}) with the values, or the broker's secrets (docs/cli.md)"),
    **dict.fromkeys(["Git", "GitBranches", "GitFileStatus", "GitResetMode", "GitStatus"],
                    "sandbox.commands.run('git ...')"),
    **dict.fromkeys(["McpServer", "GitHubMcpServer", "GitHubMcpServerConfig"],
                    "abx mcp (the broker's own MCP server, docs/mcp.md)"),
    **dict.fromkeys(["SnapshotInfo", "SnapshotMode", "SnapshotPaginator", "AsyncSnapshotPaginator"],
                    "sandbox.pause() (a paused sandbox keeps its state)"),
    "SandboxMetrics": "sandbox.abx.system_info()",
    **dict.fromkeys(["ApiClient", "ConnectionConfig", "E2B", "E2BClientParams", "ApiParams", "HttpVersion",
                     "ProxyTypes"], "abx.Connection(host='ssh://user@machine') / Sandbox.create(host=...)"),
    **dict.fromkeys(["SandboxNetworkOpts", "SandboxNetworkRule", "SandboxNetworkRuleInfo", "SandboxNetworkRules",
                     "SandboxNetworkSelector", "SandboxNetworkSelectorContext", "SandboxNetworkTransform",
                     "SandboxNetworkTransformContext", "SandboxNetworkTransformResolver", "SandboxNetworkUpdate",
                     "SandboxNetworkInfo", "SandboxEgressProxyInfo", "SandboxEgressProxyOpts",
                     "SandboxEgressProxyTLSInfo", "SandboxEgressProxyTLSOpts"],
                    "Sandbox.create(network={'allow_out': [...], 'deny_out': [...]}) (plain dicts), "
                    "abx.Sandbox.set_network"),
    **dict.fromkeys(["SandboxLifecycle", "SandboxOnTimeout", "SandboxInfoLifecycle", "SandboxOnResume"],
                    "sandbox.set_timeout(seconds), sandbox.pause(), sandbox.abx.resume()"),
    "get_signature": "sandbox.abx.ports.url(port) (its headers) and files.read/write",
}


class _UnsupportedMeta(type):
    def __getattr__(cls, name: str) -> _Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise _unsupported(f"{cls.__name__}.{name}", _NEAREST[cls.__name__])


#: The asyncio API, imported on first use (a sync script does not pay for asyncio).
_ASYNC = ("AsyncSandbox", "AsyncCommands", "AsyncCommandHandle", "AsyncCommandInputHandle", "AsyncFilesystem",
          "AsyncSandboxPaginator", "AsyncWatchHandle")


def __getattr__(name: str) -> _Any:
    """The asyncio classes (loaded on first use), and E2B names with no counterpart:
    importable (so E2B code loads), any use of them raises :class:`NotSupportedException`
    naming the nearest abx call."""
    if name in _ASYNC:
        from . import _async

        return getattr(_async, name)
    if name in _NEAREST:
        def _refuse(*a: _Any, **kw: _Any) -> _Any:
            raise _unsupported(name, _NEAREST[name])

        stub = _UnsupportedMeta(name, (), {"__init__": _refuse, "__new__": lambda cls, *a, **kw: _refuse(),
                                           "__doc__": f"Not in abx: {_NEAREST[name]}."})
        globals()[name] = stub
        return stub
    raise AttributeError(f"module 'abx.e2b' has no attribute {name!r}")


__all__ += ["AsyncCommandInputHandle", "OutputHandler", "Username", "WriteData", "AsyncWriteData",
            "SandboxListOrder", "ALL_TRAFFIC"]
