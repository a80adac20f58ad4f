"""E2B's code interpreter ``Sandbox`` (``e2b-code-interpreter`` 2.11.5): ``run_code`` with
contexts and callbacks, on the broker's ``code/*`` (``code.interpret``)."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Callable, Dict, List, Optional, Union

from ._models import (
    Context, Execution, ExecutionError, InvalidArgumentException, Logs, OutputMessage, Result, TimeoutException,
    to_abx,
)
from ._sync import Sandbox as _Base, call, honour_request_timeout

#: E2B's languages that abx's interpreters (python3, node, bash) run.
LANGUAGES = {None: "python", "python": "python", "python3": "python", "py": "python", "javascript": "javascript",
             "js": "javascript", "bash": "bash", "sh": "bash", "shell": "bash"}
_RUN_IDS = itertools.count(1)


def _language(language: Optional[str]) -> str:
    if language in LANGUAGES:
        return LANGUAGES[language]
    raise InvalidArgumentException(
        f"language={language!r}: abx's interpreters are python, javascript and bash (typescript, r and java have "
        f"none); run another one with commands.run (e.g. 'npx tsx file.ts').")


def _main_index(code: str, language: str, results: List[Dict[str, Any]]) -> Optional[int]:
    """Which result is the cell's value (E2B's ``is_main_result``): Python's last statement
    is an expression (not a display/show call) and gave the last non-figure result;
    JavaScript's completion value is its last result; bash has none."""
    if not results:
        return None
    if language == "javascript":
        return len(results) - 1
    if language != "python":
        return None
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return None
    v = tree.body[-1].value
    if isinstance(v, ast.Call):
        f = v.func
        name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
        if name in ("display", "show", "print"):
            return None
    for i in range(len(results) - 1, -1, -1):
        if not str(results[i].get("text/plain", "")).startswith("<Figure"):
            return i
    return None


def build_execution(code: str, language: str, r: Dict[str, Any]) -> Execution:
    bundles = list(r.get("results") or [])
    main = _main_index(code, language, bundles)
    results = [Result.from_bundle(b, i == main) for i, b in enumerate(bundles)]
    err = r.get("error")
    out = r.get("stdout") or ""
    errs = r.get("stderr") or ""
    return Execution(results=results,
                     logs=Logs(stdout=[out] if out else [], stderr=[errs] if errs else []),
                     error=ExecutionError(err.get("name", ""), err.get("value", ""), err.get("traceback", ""))
                     if err else None,
                     execution_count=r.get("executionCount"))


class Notes:
    """``code/output`` notifications of one run as E2B's callbacks. The callbacks run in order
    on a thread of their own (started only when there is one), so that a callback may call
    the SDK itself; :meth:`close` waits for them and raises the first callback's error."""

    def __init__(self, run_id: str, on_stdout: Any, on_stderr: Any, on_result: Any, on_error: Any,
                 invoke: Callable[[Any, Any], None]) -> None:
        self.run_id = run_id
        self.cbs = (on_stdout, on_stderr, on_result, on_error)
        self.invoke = invoke
        self.stdout: List[str] = []
        self.stderr: List[str] = []
        self._q: Any = None
        self._thread: Any = None
        self._error: Optional[BaseException] = None
        if any(self.cbs):
            import queue
            import threading

            self._q = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._deliver, name=f"abx-e2b-{run_id}", daemon=True)
            self._thread.start()

    def _deliver(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if self._error is None:
                try:
                    self.invoke(*item)
                except BaseException as e:  # noqa: BLE001 (raised by close(), in the caller)
                    self._error = e

    def _emit(self, cb: Any, arg: Any) -> None:
        if cb is not None:
            self._q.put((cb, arg))

    def close(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error

    def __call__(self, method: str, p: Dict[str, Any]) -> None:
        if method != "code/output" or p.get("runId") != self.run_id:
            return
        on_stdout, on_stderr, on_result, on_error = self.cbs
        kind = p.get("type")
        now = int(time.time() * 1e9)
        if kind == "stdout":
            self.stdout.append(p.get("text", ""))
            self._emit(on_stdout, OutputMessage(p.get("text", ""), now, False))
        elif kind == "stderr":
            self.stderr.append(p.get("text", ""))
            self._emit(on_stderr, OutputMessage(p.get("text", ""), now, True))
        elif kind == "result":
            self._emit(on_result, Result.from_bundle(p.get("result") or {}))
        elif kind == "error":
            e = p.get("error") or {}
            self._emit(on_error, ExecutionError(e.get("name", ""), e.get("value", ""), e.get("traceback", "")))


def _plain(cb: Any, arg: Any) -> None:
    cb(arg)


def code_params(sb: Any, code: str, language: Optional[str], context: Union[Context, str, None],
                envs: Optional[Dict[str, str]], timeout: Optional[float], run_id: str) -> Dict[str, Any]:
    if language is not None and context is not None:
        raise InvalidArgumentException("You can provide context or language, but not both at the same time.")
    p: Dict[str, Any] = {"sandbox": sb._abx._route, "code": code, "runId": run_id}
    if context is not None:
        p["context"] = context.id if isinstance(context, Context) else str(context)
    else:
        p["language"] = _language(language)
    if envs:
        p["env"] = dict(envs)
    if timeout:
        p["timeout"] = float(timeout)
    return p


def finish(code: str, language: str, r: Dict[str, Any], timeout: Optional[float],
           notes: Optional["Notes"] = None) -> Execution:
    if r.get("timedOut"):
        raise TimeoutException(
            f"Execution timed out: the cell ran longer than timeout={timeout} s and was interrupted"
            f"{' (the context was restarted: its state is lost)' if r.get('restarted') else ''}.")
    ex = build_execution(code, language, r)
    # E2B's logs are the pieces as they came: the notifications' (the reply has them joined),
    # unless the reply kept less or more (truncated output: the reply's word stands).
    if notes is not None and not r.get("truncated"):
        if "".join(notes.stdout) == (r.get("stdout") or ""):
            ex.logs.stdout = list(notes.stdout)
        if "".join(notes.stderr) == (r.get("stderr") or ""):
            ex.logs.stderr = list(notes.stderr)
    return ex


def run_id() -> str:
    return f"e2b-{os.getpid()}-{next(_RUN_IDS)}"


@honour_request_timeout
class Sandbox(_Base):
    """E2B's code interpreter ``Sandbox``: ``run_code`` and code contexts, on abx's
    ``code/*`` (``local``: python3, node, bash in the sandbox)."""

    default_template = "code-interpreter-v1"

    def run_code(self, code: str, language: Optional[str] = None, context: Optional[Context] = None,
                 on_stdout: Optional[Callable[[OutputMessage], Any]] = None,
                 on_stderr: Optional[Callable[[OutputMessage], Any]] = None,
                 on_result: Optional[Callable[[Result], Any]] = None,
                 on_error: Optional[Callable[[ExecutionError], Any]] = None,
                 envs: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                 request_timeout: Optional[float] = None) -> Execution:
        """Run a cell in the default context of ``language`` (python default) or in ``context``."""
        rid = run_id()
        p = code_params(self, code, language, context, envs, timeout, rid)
        lang = p.get("language") or (context.language if isinstance(context, Context) else "python")
        notes = Notes(rid, on_stdout, on_stderr, on_result, on_error, _plain)
        try:
            r = call(self._abx.connection.call, "code/run", p, on_note=notes, timeout=request_timeout)
        finally:
            notes.close()
        return finish(code, lang, r or {}, timeout, notes)

    def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None,
                            request_timeout: Optional[float] = None) -> Context:
        """A new interpreter (``cwd`` default: the home, ``/home/user``)."""
        p: Dict[str, Any] = {"sandbox": self._abx._route, "language": _language(language)}
        if cwd:
            p["cwd"] = to_abx(cwd)
        return Context.from_json(call(self._abx.connection.call, "code/createContext", p, timeout=request_timeout))

    def list_code_contexts(self) -> List[Context]:
        r = call(self._abx.connection.call, "code/listContexts", {"sandbox": self._abx._route})
        return [Context.from_json(c) for c in (r or {}).get("contexts", [])]

    def restart_code_context(self, context: Union[Context, str]) -> None:
        cid = context.id if isinstance(context, Context) else context
        call(self._abx.connection.call, "code/restartContext", {"sandbox": self._abx._route, "context": cid})

    def remove_code_context(self, context: Union[Context, str]) -> None:
        cid = context.id if isinstance(context, Context) else context
        call(self._abx.connection.call, "code/removeContext", {"sandbox": self._abx._route, "context": cid})
