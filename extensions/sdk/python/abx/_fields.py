"""The fields of every broker type (docs/openrpc.json, components.schemas), generated: a
:class:`~abx.Record` attribute that names none of its type's fields raises AttributeError.
Regenerate after docs/openrpc.json changes (tests/test_native_fixes.py checks it is current):

    python extensions/sdk/python/abx/_fields.py docs/openrpc.json
"""

FIELDS = {
    'ApplyResult': ('applied', 'conflicts', 'skipped', 'truncated'),
    'AttachResult': ('droppedBytes', 'execId', 'replayed', 'running'),
    'BlockedCount': ('count', 'host', 'last', 'port'),
    'BrokerCapabilities': ('framings', 'maxMessageSize', 'methods'),
    'BrokerStatus': ('connections', 'dataDir', 'inFlight', 'logFile', 'pid', 'providers', 'sandboxes', 'socket', 'startedAt', 'subscribers', 'uptimeMs', 'version'),
    'Capabilities': ('capabilities', 'features'),
    'Change': ('binary', 'change', 'explicitOnly', 'mode', 'patch', 'path', 'size', 'symlinkTarget', 'type'),
    'CodeContext': ('cwd', 'default', 'executionCount', 'id', 'language', 'queued', 'restarts', 'running', 'sandbox'),
    'CodeContexts': ('contexts',),
    'CodeError': ('name', 'traceback', 'value'),
    'CodeOutput': ('context', 'error', 'result', 'runId', 'sandbox', 'text', 'type'),
    'CodeResult': ('context', 'error', 'executionCount', 'restarted', 'results', 'stderr', 'stdout', 'timedOut', 'truncated'),
    'ConfigureResult': ('configured',),
    'DiffResult': ('changes', 'truncated'),
    'DiscardResult': ('discarded', 'truncated'),
    'DoctorCheck': ('code', 'detail', 'name', 'ok'),
    'DoctorResult': ('checks', 'ok'),
    'ExecExit': ('execId', 'exitCode', 'signal', 'timedOut'),
    'ExecOutput': ('data', 'encoding', 'execId', 'stream'),
    'ExecResult': ('durationMs', 'encoding', 'exitCode', 'memoryLimited', 'sandbox', 'signal', 'stderr', 'stdout', 'timedOut', 'truncated'),
    'ExecStarted': ('execId', 'pid', 'sandbox'),
    'FileChunk': ('data', 'encoding', 'eof', 'offset', 'size'),
    'FileEntry': ('mode', 'modifiedAt', 'name', 'path', 'size', 'type'),
    'FileList': ('entries',),
    'FilesChanged': ('kind', 'path', 'sandbox', 'watchId'),
    'FilesProgress': ('bytes', 'path', 'sandbox', 'total'),
    'InitializeResult': ('capabilities', 'protocolVersion', 'serverInfo'),
    'InstallPlan': ('digest', 'id', 'installed', 'manifest', 'name', 'path', 'previous', 'security', 'source', 'trust', 'version'),
    'KillResult': ('killed',),
    'LogEntry': ('argv', 'client', 'code', 'cwd', 'durationMs', 'error', 'exitCode', 'kind', 'language', 'seq', 'signal', 'startedAt'),
    'LogResult': ('dropped', 'entries', 'last'),
    'Mount': ('mode', 'source', 'target'),
    'MountSpec': ('mode', 'source', 'target'),
    'NetworkPolicy': ('allow', 'deny'),
    'NetworkPolicyView': ('allow', 'blocked', 'deny'),
    'PathReason': ('path', 'reason'),
    'PeerInfo': ('name', 'version'),
    'PortUrl': ('headers', 'url'),
    'PreviousInstall': ('commit', 'digest', 'version'),
    'ProcessEntry': ('command', 'pid', 'ppid', 'status'),
    'ProcessList': ('processes',),
    'ProviderFailure': ('code', 'message', 'provider', 'suggestion'),
    'ProviderInfo': ('default', 'description', 'features', 'id', 'kind', 'name', 'trust', 'version'),
    'ProviderList': ('providers',),
    'ProviderProcess': ('disabled', 'id', 'inFlight', 'kind', 'lastError', 'pid', 'restarts', 'running'),
    'ProviderSource': ('commit', 'ref', 'subdir', 'url'),
    'ProviderSummary': ('default', 'features', 'id', 'kind', 'name', 'trust', 'version'),
    'PtySize': ('cols', 'rows'),
    'Sandbox': ('expiresAt', 'id', 'metadata', 'mounts', 'network', 'provider', 'region', 'startedAt', 'status', 'template', 'templateDigest', 'timeout', 'url'),
    'SandboxBlocked': ('count', 'host', 'port', 'provider', 'sandbox'),
    'SandboxChanged': ('change', 'provider', 'sandbox', 'sandboxInfo'),
    'SandboxLimits': ('cpus', 'memory', 'pids'),
    'SandboxList': ('errors', 'sandboxes'),
    'SecretList': ('keys',),
    'SecretRemoved': ('removed',),
    'SizeResult': ('size',),
    'SystemInfo': ('arch', 'cpuCount', 'diskFreeGb', 'diskTotalGb', 'hostname', 'isolation', 'kernel', 'memoryTotalMb', 'os'),
    'TemplateInfo': ('base', 'config', 'digest', 'name', 'names', 'pulledAt', 'size', 'source'),
    'TemplateList': ('templates',),
    'TemplatesInitResult': ('files', 'from', 'hint', 'language', 'name', 'path'),
    'TemplatesProgress': ('bytes', 'cached', 'line', 'step', 'template', 'total'),
    'TemplatesRemoved': ('freedBytes', 'removed'),
    'TestOutcome': ('detail', 'durationMs', 'name', 'outcome'),
    'TestResult': ('concurrency', 'failed', 'passed', 'results', 'skipped'),
    'TestResultNote': ('detail', 'durationMs', 'id', 'name', 'outcome'),
    'TransferResult': ('localPath', 'path', 'size'),
    'UpdateResult': ('providers',),
    'UpdateStatus': ('error', 'from', 'fromDigest', 'id', 'status', 'to', 'toDigest'),
    'WatchStarted': ('watchId',),
}


if __name__ == "__main__":
    import json
    import sys

    schemas = json.load(open(sys.argv[1]))["components"]["schemas"]
    out = {}
    for k, v in sorted(schemas.items()):
        props = set(v.get("properties", {}))
        for sub in v.get("oneOf", []) + v.get("anyOf", []) + v.get("allOf", []):
            props |= set(sub.get("properties", {}))
        if props:
            out[k] = tuple(sorted(props))
    src = open(__file__).read()
    start, end = src.index("FIELDS = {"), src.index("\n}\n", src.index("FIELDS = {")) + 3
    lines = "".join(f"    {k!r}: {v!r},\n" for k, v in out.items())
    open(__file__, "w").write(src[:start] + "FIELDS = {\n" + lines + "}\n" + src[end:])
