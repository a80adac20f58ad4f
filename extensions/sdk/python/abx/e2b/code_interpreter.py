"""E2B's code interpreter SDK (``e2b-code-interpreter`` 2.11.5) on the abx broker:

    from abx.e2b.code_interpreter import Sandbox    # was: from e2b_code_interpreter import Sandbox

Everything of :mod:`abx.e2b` too, as ``e2b_code_interpreter`` re-exports ``e2b``."""

from . import (  # noqa: F401
    ALL_TRAFFIC, E2B_CODE_INTERPRETER_VERSION, E2B_VERSION, AsyncWriteData, AuthenticationException, BuildException,
    CommandExitException, CommandHandle, CommandResult, Commands, EntryInfo, FileNotFoundException, Filesystem,
    FilesystemEvent, FilesystemEventType, FileType, FileUploadException, GitAuthException, GitUpstreamException,
    GuestUnresponsiveException, InvalidArgumentException, NotEnoughSpaceException, NotFoundException,
    NotSupportedException, OutputHandler, ProcessInfo, PtyOutput, PtySize, RateLimitException, SandboxException,
    SandboxInfo, SandboxListOrder, SandboxNotFoundException, SandboxNotRunningException, SandboxPaginator,
    SandboxQuery, SandboxState, SandboxUnreachableException, SecretException, SecretNotFoundException,
    ServiceBusyException, Stderr, Stdout, TemplateException, TimeoutException, Username, VolumeException,
    VolumeNotFoundException, VolumePathNotFoundException, WatchHandle, WriteData, WriteInfo,
)
from . import __all__ as _base_all
from ._code import Sandbox
from ._models import Context, Execution, ExecutionError, Logs, MIMEType, OutputMessage, Result

__all__ = [*_base_all, "Context", "Execution", "ExecutionError", "Logs", "MIMEType", "OutputMessage", "Result"]

RunCodeLanguage = str


def __getattr__(name: str):  # noqa: ANN201
    """``AsyncSandbox`` (the code interpreter's, loaded on first use), the other asyncio
    classes, and E2B names with no counterpart (``abx.e2b``'s stubs)."""
    if name == "AsyncSandbox":
        from ._async import AsyncCodeSandbox

        return AsyncCodeSandbox
    from . import __getattr__ as _base

    return _base(name)
