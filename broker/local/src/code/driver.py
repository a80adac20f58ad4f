# The abx code/run driver for Python: a long-lived interpreter that runs cells read as JSON
# lines from a private copy of fd 0 and answers with frames on fd 1 (a marker, one JSON
# object, a newline); whatever else appears on fd 1 or fd 2 is output of child processes.
# Embedded in the broker (broker/local/src/code/mod.rs), which starts `python3 -c` with a
# short bootstrap that reads this file from stdin and runs it as `<abx-driver>` (so it is
# not on the command line, and tracebacks can leave its frames out); needs nothing beyond
# the standard library. Python 3.6+.
import ast, base64, builtins, io, json, linecache, os, signal, sys, traceback, types

_NONCE = os.environ.pop("ABX_CODE_NONCE", "")
_MARK = ("\x1f" + _NONCE).encode()
_IN = os.fdopen(os.dup(0), "rb")
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
os.environ.setdefault("MPLBACKEND", "Agg")
_st = {"running": False, "writing": False, "pending": False}
# The longest text sent in one frame (characters): the broker counts a frame in its memory
# budget while it reads it, so a cell whose client is slow holds at most a small partial
# frame (issue 42).
_PIECE = 1 << 16
# The name of this file's code (the bootstrap compiles it so): tracebacks leave it out.
_DRIVER = "<abx-driver>"


def _on_int(sig, frame):
    if not _st["running"]:
        return
    if _st["writing"]:
        _st["pending"] = True
        return
    raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_int)


def _send(obj):
    data = _MARK + json.dumps(obj).encode() + b"\n"
    _st["writing"] = True
    try:
        view = memoryview(data)
        while view:
            n = os.write(1, view)
            view = view[n:]
    finally:
        _st["writing"] = False
    if _st["pending"] and _st["running"]:
        _st["pending"] = False
        raise KeyboardInterrupt


class _Stream(io.TextIOBase):
    def __init__(self, name, fd):
        self.name, self._fd, self._buf, self._n = name, fd, [], 0
        self.other = None

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "strict"

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if s:
            if self.other is not None and self.other._buf:
                self.other.flush()
            self._buf.append(s)
            self._n += len(s)
            if "\n" in s or self._n > 8192:
                self.flush()
        return len(s)

    def flush(self):
        if self._buf:
            text = "".join(self._buf)
            self._buf, self._n = [], 0
            # In pieces: the broker drops a frame past its size limit.
            for i in range(0, len(text), _PIECE):
                _send({"t": self.name, "d": text[i : i + _PIECE]})

    @property
    def buffer(self):
        return _Bytes(self)


class _Bytes:
    """sys.stdout.buffer: bytes written as UTF-8 text (invalid bytes replaced)."""

    def __init__(self, s):
        self._s = s

    def write(self, b):
        self._s.write(bytes(b).decode("utf-8", "replace"))
        return len(b)

    def flush(self):
        self._s.flush()


_out, _err = _Stream("stdout", 1), _Stream("stderr", 2)
_out.other, _err.other = _err, _out
sys.stdout, sys.stderr = _out, _err
sys.stdin = io.StringIO("")

_MIME = [
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_json_", "application/json"),
    ("_repr_latex_", "text/latex"),
]


def _b64(v):
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    return v


def _is_figure(obj):
    return type(obj).__module__.startswith("matplotlib") and type(obj).__name__ == "Figure"


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _bundle(obj):
    b = {}
    if _is_figure(obj):
        b["image/png"] = _figure_png(obj)
    elif not isinstance(obj, type):
        f = getattr(obj, "_repr_mimebundle_", None)
        if callable(f):
            try:
                r = f(include=None, exclude=None)
            except TypeError:
                r = f()
            if isinstance(r, tuple):
                r = r[0]
            if isinstance(r, dict):
                for k, v in r.items():
                    b[k] = _b64(v)
        for meth, mime in _MIME:
            if mime in b:
                continue
            f = getattr(obj, meth, None)
            if not callable(f):
                continue
            try:
                r = f()
            except Exception:
                continue
            if isinstance(r, tuple):
                r = r[0]
            if r is None:
                continue
            if mime in ("image/png", "image/jpeg"):
                r = _b64(r)
            elif mime == "application/json" and isinstance(r, str):
                try:
                    r = json.loads(r)
                except ValueError:
                    pass
            b[mime] = r
    if "text/plain" not in b:
        try:
            b["text/plain"] = repr(obj)
        except Exception as e:
            b["text/plain"] = "<repr failed: %s>" % e
    return b


def _emit(obj):
    _out.flush()
    _err.flush()
    try:
        b = _bundle(obj)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        b = {"text/plain": "<display failed: %s: %s>" % (type(e).__name__, e)}
    _send({"t": "result", "b": b})


def display(*objs, **kw):
    """Show objects as rich results (IPython's display, without IPython)."""
    for o in objs:
        _emit(o)


builtins.display = display


def _flush_figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for n in plt.get_fignums():
        _emit(plt.figure(n))
    plt.close("all")


_patched = [False]


def _patch():
    if _patched[0]:
        return
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    _patched[0] = True

    def show(*a, **k):
        _flush_figures()

    plt.show = show


_import = builtins.__import__


def _hooked_import(*a, **k):
    m = _import(*a, **k)
    if not _patched[0] and "matplotlib.pyplot" in sys.modules:
        _patch()
    return m


builtins.__import__ = _hooked_import

_main = types.ModuleType("__main__")
_main.__dict__["__builtins__"] = builtins
sys.modules["__main__"] = _main
_ns = _main.__dict__
_FLAGS = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
_loop = [None]


def _await(v):
    import inspect
    if inspect.iscoroutine(v):
        import asyncio
        if _loop[0] is None:
            _loop[0] = asyncio.new_event_loop()
        return _loop[0].run_until_complete(v)
    return v


def _clean(te, seen):
    """Leave the driver's frames out of a traceback (and the bootstrap's, which come
    first): the user sees their own code only, also in chained exceptions."""
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    stack = [f for f in te.stack if f.filename != _DRIVER]
    while stack and stack[0].filename == "<string>":
        stack.pop(0)
    te.stack = traceback.StackSummary.from_list(stack)
    _clean(te.__cause__, seen)
    _clean(te.__context__, seen)
    for sub in getattr(te, "exceptions", None) or ():
        _clean(sub, seen)


def _error(e):
    if isinstance(e, SyntaxError):
        text = "".join(traceback.format_exception_only(type(e), e))
    else:
        te = traceback.TracebackException(type(e), e, e.__traceback__)
        _clean(te, set())
        text = "".join(te.format())
    _send({"t": "error", "name": type(e).__name__, "value": str(e), "traceback": text})


def _run(code, n):
    name = "<cell %d>" % n
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, filename=name, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    _await(eval(compile(tree, name, "exec", flags=_FLAGS), _ns))
    if last is not None:
        v = _await(eval(compile(last, name, "eval", flags=_FLAGS), _ns))
        if v is not None:
            _ns["_"] = v
            _emit(v)


def _main_loop():
    _send({"t": "ready", "pid": os.getpid()})
    n = 0
    while True:
        try:
            line = _IN.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            req = json.loads(line)
        except ValueError:
            continue
        n += 1
        _st["running"] = True
        try:
            for k, v in (req.get("env") or {}).items():
                os.environ[k] = v
            _run(req.get("code", ""), n)
            _patch()
            _flush_figures()
        except BaseException as e:
            try:
                _out.flush()
                _err.flush()
                _error(e)
            except BaseException:
                pass
        finally:
            _st["running"] = False
            _st["pending"] = False
        try:
            _out.flush()
            _err.flush()
        except BaseException:
            pass
        _send({"t": "done"})
        os.write(2, _MARK + b"E\n")


_main_loop()
