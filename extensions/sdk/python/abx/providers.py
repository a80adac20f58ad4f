"""``abx.providers``: list, info, install, uninstall, update, doctor, test, configure,
set_default (sync). Installing follows the CLI's rules (cli/abx/src/cmd/provider.rs): nothing
is installed without a confirmation: ``yes=True`` (after reviewing), or ``confirm=`` a
function shown the plan (a dry run) that returns True; otherwise the broker refuses with
:class:`~abx.RefusedError` (E8012) saying what to pass. Pinning and transport rules are the
broker's (``ref``/``sha256`` pins; ``allow_unpinned``, ``allow_insecure_transport``)."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Optional

from . import _types as t
from ._conn import Connection, default_connection
from .errors import make_error

Confirm = Callable[[t.Record], bool]


def _c(connection: Optional[Connection], host: Optional[str]) -> Connection:
    return connection if connection is not None else default_connection(host)


def install_source(source: str, remote: bool) -> str:
    """A local directory as an absolute path (the daemon has its own cwd), on this machine."""
    if not remote and "://" not in source and os.path.exists(source):
        return os.path.realpath(source)
    return source


def list(*, host: Optional[str] = None, connection: Optional[Connection] = None) -> List[t.Record]:  # noqa: A001
    """``[{id, name, version, kind, trust, features, default}]``."""
    return [t.Record(p) for p in (_c(connection, host).call("provider/list") or {}).get("providers", [])]


def info(id: str, *, host: Optional[str] = None, connection: Optional[Connection] = None) -> t.Record:
    return t.Record(_c(connection, host).call("provider/info", t.p_id(id)))


def install(source: str, *, subdir: Optional[str] = None, ref: Optional[str] = None, sha256: Optional[str] = None,
            allow_unpinned: bool = False, allow_insecure_transport: bool = False, yes: bool = False,
            confirm: Optional[Confirm] = None, dry_run: bool = False, replace: bool = False,
            host: Optional[str] = None, connection: Optional[Connection] = None) -> t.Record:
    """Install a provider from a git URL, an archive URL (with ``sha256``) or a local directory.
    ``dry_run=True`` returns the plan. See the module docs for confirmation."""
    c = _c(connection, host)
    src = install_source(source, c.is_remote)

    def params(conf: bool, dry: bool) -> Dict[str, Any]:
        return t.p_install(src, subdir, ref, sha256, allow_unpinned, allow_insecure_transport, conf, dry, replace)

    if dry_run:
        return t.Record(c.call("provider/install", params(False, True)))
    ok = yes
    if not ok and confirm is not None:
        plan = t.Record(c.call("provider/install", params(False, True)))
        if not confirm(plan):
            raise make_error("E1009", "Aborted: nothing was installed.",
                             "Confirm the plan, or pass yes=True after reviewing.")
        ok = True
    return t.Record(c.call("provider/install", params(ok, False)))


def uninstall(id: str, *, yes: bool = False, host: Optional[str] = None,
              connection: Optional[Connection] = None) -> None:
    """Remove a provider (``yes=True`` confirms; without it the broker refuses, E8012)."""
    p = t.p_id(id)
    if yes:
        p["confirm"] = True
    _c(connection, host).call("provider/uninstall", p)


def update(id: Optional[str] = None, *, ref: Optional[str] = None, check: bool = False, host: Optional[str] = None,
           connection: Optional[Connection] = None) -> t.Record:
    p: Dict[str, Any] = {k: v for k, v in (("id", id), ("ref", ref)) if v is not None}
    if check:
        p["check"] = True
    return t.Record(_c(connection, host).call("provider/update", p))


def doctor(id: str, *, host: Optional[str] = None, connection: Optional[Connection] = None) -> t.Record:
    """``{ok, checks: [{name, ok, detail, code?}]}``."""
    return t.Record(_c(connection, host).call("provider/doctor", t.p_id(id)))


def test(id: str, filter: Optional[str] = None, *, concurrency: Optional[int] = None,
         on_result: Optional[Callable[[t.Record], None]] = None, host: Optional[str] = None,
         connection: Optional[Connection] = None) -> t.Record:
    """Run the contract kit against a provider: ``{results, passed, failed, skipped}``;
    ``on_result`` sees each ``provider/testResult`` as it finishes."""

    def note(method: str, p: Dict[str, Any]) -> None:
        if method == "provider/testResult" and on_result is not None:
            on_result(t.Record(p))

    return t.Record(_c(connection, host).call("provider/test", t.p_id(id, filter=filter, concurrency=concurrency),
                                              on_note=note))


def configure(id: str, values: Mapping[str, Any], *, host: Optional[str] = None,
              connection: Optional[Connection] = None) -> t.Record:
    return t.Record(_c(connection, host).call("provider/configure", {"id": id, "values": dict(values)}))


def set_default(id: str, *, host: Optional[str] = None, connection: Optional[Connection] = None) -> None:
    _c(connection, host).call("provider/setDefault", t.p_id(id))
