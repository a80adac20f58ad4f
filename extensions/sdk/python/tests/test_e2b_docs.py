"""E2B's own documented examples (e2b.dev/docs, for ``e2b`` 2.63.0 and ``e2b-code-interpreter``
2.11.5), run against the ``local`` provider with only the import changed
(``from e2b...`` -> ``from abx.e2b...``, ``from e2b_code_interpreter`` ->
``from abx.e2b.code_interpreter``). Each snippet is kept as the page shows it (its URL
beside it); where a snippet differs, the difference is said on its line. Each test then
asserts what the snippet did, in the sandbox and in what it printed.

The sandboxes get matplotlib the way an E2B template would ship it: the test venv's
site-packages mounted read-only at ``/pysite`` with ``PYTHONPATH`` (the sandbox's own
``/usr/bin/python3`` sees ``/usr``, not the venv)."""

from __future__ import annotations

import os
import re
import sysconfig
import textwrap
import time
import urllib.request

import pytest

import abx
import abx.e2b._sync as e2b_sync
from conftest import wait_until

SITE = sysconfig.get_paths()["purelib"]


@pytest.fixture
def docs(home, monkeypatch, tmp_path, capsys):
    """Runs a snippet as E2B's docs show it; kills every sandbox it made."""
    made = []
    real = abx.Sandbox.create.__func__

    def create(cls, *a, **kw):
        env = dict(kw.get("env") or {})
        env.setdefault("PYTHONPATH", "/pysite")
        kw["env"] = env
        kw["mounts"] = [*(kw.get("mounts") or []), f"{SITE}:/pysite:ro"]
        sb = real(cls, *a, **kw)
        made.append(sb)
        return sb

    monkeypatch.setattr(e2b_sync._Native, "create", classmethod(create))
    monkeypatch.chdir(tmp_path)

    def run(url: str, src: str) -> dict:
        code = textwrap.dedent(src)
        code = code.replace("from e2b_code_interpreter import", "from abx.e2b.code_interpreter import")
        code = re.sub(r"^from e2b import", "from abx.e2b import", code, flags=re.M)
        assert "e2b_code_interpreter" not in code and not re.search(r"^(from|import) e2b\b", code, re.M)
        ns: dict = {"__name__": "__e2b_docs__"}
        exec(compile(code, url, "exec"), ns)  # noqa: S102 (the documented snippet)
        return ns

    run.out = lambda: capsys.readouterr().out  # type: ignore[attr-defined]
    yield run
    for sb in made:
        try:
            sb.kill()
        except abx.AbxError:
            pass


def test_quickstart(docs):
    ns = docs("https://e2b.dev/docs/quickstart", '''
        from e2b_code_interpreter import Sandbox

        sbx = Sandbox.create() # By default the sandbox is alive for 5 minutes
        execution = sbx.run_code("print('hello world')") # Execute Python inside the sandbox
        print(execution.logs)

        files = sbx.files.list("/")
        print(files)
    ''')  # the page's `load_dotenv()` lines (E2B_API_KEY from .env) are left out: no key is needed
    assert ns["execution"].logs.stdout == ["hello world\n"] and ns["execution"].error is None
    assert {"workspace", "tmp", "usr"} <= {f.name for f in ns["files"]}
    assert "Logs(stdout: ['hello world\\n'], stderr: [])" in docs.out()


def test_commands_run(docs):
    ns = docs("https://e2b.dev/docs/commands", '''
        from e2b_code_interpreter import Sandbox

        sandbox = Sandbox.create()
        result = sandbox.commands.run('ls -l')
        print(result)
    ''')
    assert ns["result"].exit_code == 0 and ns["result"].stdout.startswith("total")
    assert "CommandResult(" in docs.out()


def test_commands_streaming(docs):
    ns = docs("https://e2b.dev/docs/commands/streaming", '''
        from e2b import Sandbox

        sandbox = Sandbox.create()

        result = sandbox.commands.run('echo hello; sleep 1; echo world', on_stdout=lambda data: print(data), on_stderr=lambda data: print(data))
        print(result)
    ''')
    out = docs.out()
    assert out.index("hello") < out.index("world") < out.index("CommandResult(")
    assert ns["result"].stdout == "hello\nworld\n" and ns["result"].exit_code == 0


def test_commands_background(docs):
    t0 = time.monotonic()
    ns = docs("https://e2b.dev/docs/commands/background", '''
        from e2b import Sandbox

        sandbox = Sandbox.create()

        # Start the command in the background
        command = sandbox.commands.run('echo hello; sleep 10; echo world', background=True)

        # Get stdout and stderr from the command running in the background.
        # You can run this code in a separate thread or use command.wait() to wait for the command to finish.
        for stdout, stderr, _ in command:
            if stdout:
                print(stdout)
            if stderr:
                print(stderr)

        # Kill the command
        command.kill()
    ''')
    assert time.monotonic() - t0 >= 9  # the loop followed the command to its end
    assert docs.out().split() == ["hello", "world"]
    assert ns["command"].kill() is False  # it had ended: nothing to kill


def test_background_command_kill_ends_it(docs):
    ns = docs("https://e2b.dev/docs/commands/background (JavaScript tab: run in background, then kill)", '''
        from e2b import Sandbox

        sandbox = Sandbox.create()
        command = sandbox.commands.run('echo hello; sleep 10; echo world', background=True, on_stdout=lambda data: print(data))
        command.kill()
    ''')
    from abx.e2b import CommandExitException

    with pytest.raises(CommandExitException) as e:
        ns["command"].wait()
    assert e.value.exit_code != 0 and "world" not in (e.value.stdout or "")
    assert not [p for p in ns["sandbox"].commands.list() if "sleep 10" in " ".join([p.cmd, *p.args])]


def test_files_read_write(docs):
    ns = docs("https://e2b.dev/docs/filesystem/read-write (paths: /home/user/path/to/...)", '''
        from e2b import Sandbox

        sandbox = Sandbox.create()

        sandbox.files.write('/home/user/path/to/file', 'file content')
        file_content = sandbox.files.read('/home/user/path/to/file')

        sandbox.files.write_files([
            { "path": "/home/user/path/to/a", "data": "file content" },
            { "path": "another/path/to/b", "data": "file content" }
        ])
    ''')
    sb = ns["sandbox"]
    assert ns["file_content"] == "file content"
    # /home/user is the sandbox's /workspace; relative paths are under it; parents are made
    assert sb.abx.files.read("/workspace/path/to/a") == "file content"
    assert sb.abx.files.read("another/path/to/b") == "file content"
    assert sb.files.read("/home/user/another/path/to/b", format="bytes") == bytearray(b"file content")
    assert b"".join(sb.files.read("another/path/to/b", format="stream")) == b"file content"


def test_files_outside_the_home_give_a_clear_error(docs):
    from abx.e2b import SandboxException

    with pytest.raises(SandboxException) as e:
        docs("https://e2b.dev/docs/filesystem/read-write", '''
            from e2b import Sandbox

            sandbox = Sandbox.create()

            sandbox.files.write('/path/to/file', 'file content')
        ''')
    # the host template's root is read-only: the error says so (E4014), it does not fail silently
    assert e.value.code == "E4014" and "'/path' is read-only" in str(e.value) and "/home/user" in str(e.value)


def test_files_upload(docs, tmp_path):
    os.makedirs("path/to/local")
    with open("path/to/local/file", "wb") as f:
        f.write(b"\x00\x01local bytes\xff")
    ns = docs("https://e2b.dev/docs/filesystem/upload", '''
        from e2b import Sandbox

        sandbox = Sandbox.create()

        # Read file from local filesystem
        with open("path/to/local/file", "rb") as file:
            # Upload file to sandbox
            sandbox.files.write("/home/user/my-file", file)
    ''')
    assert ns["sandbox"].abx.files.read_bytes("/workspace/my-file") == b"\x00\x01local bytes\xff"


def test_files_download(docs):
    ns = docs("https://e2b.dev/docs/filesystem/download (local path: ./local-file)", '''
        from e2b import Sandbox

        sandbox = Sandbox.create()
        sandbox.files.write('/home/user/path/in/sandbox', 'downloaded')

        # Read file from sandbox
        content = sandbox.files.read('/home/user/path/in/sandbox')
        # Write file to local filesystem
        with open('local-file', 'w') as file:
            file.write(content)
    ''')
    assert open("local-file").read() == "downloaded" and ns["content"] == "downloaded"


def test_files_watch(docs):
    ns = docs("https://e2b.dev/docs/filesystem/watch", '''
        from e2b_code_interpreter import Sandbox, FilesystemEventType

        sandbox = Sandbox.create()
        dirname = '/home/user'

        # Watch directory for changes
        handle = sandbox.files.watch_dir(dirname)
        # Trigger file write event
        sandbox.files.write(f"{dirname}/my-file", "hello")

        # Retrieve the latest new events since the last `get_new_events()` call
        events = handle.get_new_events()
        for event in events:
          print(event)
          if event.type == FilesystemEventType.WRITE:
            print(f"wrote to file {event.name}")
    ''')
    from abx.e2b import FilesystemEventType

    events = list(ns["events"])
    wait_until("the write's event", lambda: any(e.name == "my-file" for e in events)
               or bool(events.extend(ns["handle"].get_new_events())))
    assert {e.type for e in events if e.name == "my-file"} <= {FilesystemEventType.CREATE, FilesystemEventType.WRITE,
                                                               FilesystemEventType.RENAME}
    ns["handle"].stop()


def test_static_chart(docs, tmp_path):
    ns = docs("https://e2b.dev/docs/code-interpreting/create-charts-visualizations/static-charts", '''
        from e2b_code_interpreter import Sandbox
        import base64

        code_to_run = """
        import matplotlib.pyplot as plt

        plt.plot([1, 2, 3, 4])
        plt.ylabel('some numbers')
        plt.show()
        """

        sandbox = Sandbox.create()
        # Run the code inside the sandbox
        execution = sandbox.run_code(code_to_run)

        # There's only one result in this case - the plot displayed with `plt.show()`
        first_result = execution.results[0]

        if first_result.png:
          # Save the png to a file
          # The png is in base64 format.
          with open('chart.png', 'wb') as f:
            f.write(base64.b64decode(first_result.png))
          print('Chart saved as chart.png')
    ''')
    assert "Chart saved as chart.png" in docs.out()
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = ns["first_result"]
    assert "png" in r.formats() and r.is_main_result is False and ns["execution"].text is None


def test_code_streaming(docs):
    ns = docs("https://e2b.dev/docs/code-interpreting/streaming (sleeps of 3 s cut to 0.3 s)", '''
        from e2b_code_interpreter import Sandbox

        code_to_run = """
        import time
        import sys
        print("This goes first to stdout")
        time.sleep(0.3)
        print("This goes later to stderr", file=sys.stderr)
        time.sleep(0.3)
        print("This goes last")
        """
        sandbox = Sandbox.create()
        sandbox.run_code(
            code_to_run,
            # Use `on_error` to handle runtime code errors
            on_error=lambda error: print('error:', error),
            on_stdout=lambda data: print('stdout:', data),
            on_stderr=lambda data: print('stderr:', data),
        )
    ''')
    out = docs.out()
    a, b, c = (out.index(s) for s in ("stdout: This goes first", "stderr: This goes later", "stdout: This goes last"))
    assert a < b < c and "error:" not in out
    assert ns["sandbox"].run_code("1").text == "1"
    logs = ns["sandbox"].run_code("print('a'); print('b')").logs
    assert "".join(logs.stdout) == "a\nb\n" and logs.stderr == []  # the pieces as they came
    # a callback may call the SDK itself (callbacks run on a thread of their own, in order)
    sb = ns["sandbox"]
    sb.run_code("print('x')", on_stdout=lambda m: sb.files.write("from-callback.txt", m.line))
    assert sb.files.read("from-callback.txt") == "x\n"
    with pytest.raises(ZeroDivisionError):  # a callback's error reaches the caller
        sb.run_code("print('y')", on_stdout=lambda m: 1 / 0)


def test_code_streaming_results(docs):
    docs("https://e2b.dev/docs/code-interpreting/streaming (Stream results)", '''
        from e2b_code_interpreter import Sandbox

        code_to_run = """
        import matplotlib.pyplot as plt

        # Prepare data
        categories = ['Category A', 'Category B', 'Category C', 'Category D']
        values = [10, 20, 15, 25]

        # Create and customize the bar chart
        plt.figure(figsize=(10, 6))
        plt.bar(categories, values, color='green')
        plt.xlabel('Categories')
        plt.ylabel('Values')
        plt.title('Values by Category')

        # Display the chart
        plt.show()
        """

        sandbox = Sandbox.create()
        sandbox.run_code(
            code_to_run,
            on_result=lambda result: print('result:', result),
        )
    ''')
    assert re.search(r"result: .*(Figure|png)", docs.out())


def test_code_contexts(docs):
    ns = docs("https://e2b.dev/docs/code-interpreting/contexts", '''
        from e2b_code_interpreter import Sandbox

        sandbox = Sandbox.create()
        context = sandbox.create_code_context(
            cwd='/home/user',
            language='python',
            request_timeout=60_000,
        )
        result = sandbox.run_code('print("Hello, world!")', context=context)
        print(result)

        contexts = sandbox.list_code_contexts()
        print(contexts)

        sandbox.restart_code_context(context)

        sandbox.remove_code_context(context)
    ''')
    assert ns["result"].logs.stdout == ["Hello, world!\n"]
    assert ns["context"].id in [c.id for c in ns["contexts"]] and ns["context"].cwd == "/home/user"
    assert ns["context"].id not in [c.id for c in ns["sandbox"].list_code_contexts()]


def test_shared_context_value(docs):
    ns = docs("https://e2b.dev/docs/code-interpreter/examples (minimal example with the sharing context)", '''
        from e2b_code_interpreter import Sandbox

        sandbox = Sandbox.create()
        sandbox.run_code("x = 1")
        execution = sandbox.run_code("x+=1; x")
        print(execution.text)  # outputs 2
    ''')
    assert docs.out() == "2\n" and ns["execution"].results[0].is_main_result


def test_lifecycle_timeout_and_info(docs):
    ns = docs("https://e2b.dev/docs/sandbox", '''
        from e2b import Sandbox

        # Create sandbox with and keep it running for 60 seconds.
        # 🚨 Note: The units are seconds.
        sandbox = Sandbox.create(
          timeout=60,
        )

        # Change the sandbox timeout to 30 seconds.
        # 🚨 The new timeout will be 30 seconds from now.
        sandbox.set_timeout(30)

        info = sandbox.get_info()
        print(info)

        # Shutdown the sandbox immediately.
        sandbox.kill()
    ''')
    info = ns["info"]
    left = (info.end_at - info.started_at).total_seconds()
    assert 25 <= left <= 40 and info.sandbox_id == ns["sandbox"].sandbox_id
    assert ns["sandbox"].is_running() is False


def test_environment_variables(docs):
    ns = docs("https://e2b.dev/docs/sandbox/environment-variables", '''
        from e2b_code_interpreter import Sandbox

        sandbox = Sandbox.create(
          envs={
            'MY_VAR': 'my_value',
          },
        )
        result = sandbox.commands.run("echo $E2B_SANDBOX_ID")

        sandbox.run_code(
            'import os; print(os.environ.get("MY_VAR"))',
            envs={
                'MY_VAR': 'my_value'
            }
        )

        r2 = sandbox.commands.run(
            'echo $MY_VAR',
            envs={
                'MY_VAR': '123'
            }
        )
    ''')  # (the command results get names here, `result` / `r2`, to be checked)
    sb = ns["sandbox"]
    assert ns["result"].stdout.strip() == sb.sandbox_id
    assert ns["r2"].stdout == "123\n"
    assert sb.commands.run("echo $MY_VAR").stdout == "my_value\n"


def test_connect(docs):
    ns = docs("https://e2b.dev/docs/sandbox/connect", '''
        from e2b import Sandbox

        sbx = Sandbox.create()
        sandbox_id = sbx.sandbox_id

        # Connect to the sandbox
        sandbox = Sandbox.connect(sandbox_id)
        # Now you can use the sandbox as usual
        # ...
        r = sandbox.commands.run("whoami")
        print(f"Running in sandbox {sandbox.sandbox_id} as \\"{r.stdout.strip()}\\"")
    ''')
    assert ns["sandbox"].sandbox_id == ns["sbx"].sandbox_id
    assert f"Running in sandbox {ns['sbx'].sandbox_id} as" in docs.out()


def test_list_and_metadata(docs):
    ns = docs("https://e2b.dev/docs/sandbox/list", '''
        from e2b import Sandbox, SandboxQuery, SandboxState

        sandbox = Sandbox.create(
            metadata={
                "name": "My Sandbox",
            },
        )

        paginator = Sandbox.list()

        # Get the first page of sandboxes (running and paused)
        firstPage = paginator.next_items()

        running_sandbox = firstPage[0]

        print('Running sandbox metadata:', running_sandbox.metadata)
        print('Running sandbox id:', running_sandbox.sandbox_id)
        print('Running sandbox started at:', running_sandbox.started_at)
        print('Running sandbox template id:', running_sandbox.template_id)

        # Filter by metadata and state
        paginator = Sandbox.list(
            query=SandboxQuery(
                metadata={"name": "My Sandbox"},
                state=[SandboxState.RUNNING],
            ),
        )
        sandboxes = paginator.next_items()
    ''')
    assert [s.sandbox_id for s in ns["sandboxes"]] == [ns["sandbox"].sandbox_id]
    assert ns["running_sandbox"].sandbox_id == ns["sandbox"].sandbox_id  # newest first
    assert "Running sandbox metadata: {'name': 'My Sandbox'}" in docs.out()
    assert ns["paginator"].has_next is False


def test_get_host(docs):
    ns = docs("https://e2b.dev/docs/sandbox/internet-access (connecting to a sandbox's port)", '''
        from e2b import Sandbox

        sandbox = Sandbox.create()
        process = sandbox.commands.run("python3 -m http.server 3000", background=True)
        host = sandbox.get_host(3000)
        url = f"https://{host}"
        print('Server started at:', url)
    ''')  # (the page runs `python`; a Debian sandbox has `python3`)
    host = ns["host"]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", host)

    def up() -> bool:
        try:
            return urllib.request.urlopen(f"http://{host}/", timeout=2).status == 200
        except OSError:
            return False

    wait_until("the sandbox's http.server through get_host (plain http on local)", up)
    ns["process"].kill()


def test_errors_command_exit_and_timeout(docs):
    ns = docs("https://e2b.dev/docs/sdk-reference/python-sdk/v2.63.0/sandbox_sync (CommandExitException, timeout)", '''
        from e2b_code_interpreter import Sandbox, CommandExitException, TimeoutException

        sandbox = Sandbox.create()
        try:
            sandbox.commands.run("echo oops >&2; exit 3")
        except CommandExitException as e:
            print(e.exit_code, e.stderr)

        try:
            sandbox.commands.run("sleep 10", timeout=1)
        except TimeoutException as e:
            print("timed out")

        execution = sandbox.run_code("1/0")
        if execution.error:
            print(execution.error.name, execution.error.value)
    ''')
    assert docs.out() == "3 oops\n\ntimed out\nZeroDivisionError division by zero\n"
    assert "ZeroDivisionError" in ns["execution"].error.traceback


def test_code_interpreter_run_code_timeout(docs):
    from abx.e2b import TimeoutException

    with pytest.raises(TimeoutException):
        docs("https://e2b.dev/docs/sdk-reference/code-interpreter-python-sdk/v2.11.5/sandbox (run_code timeout)", '''
            from e2b_code_interpreter import Sandbox

            sandbox = Sandbox.create()
            sandbox.run_code("import time; time.sleep(30)", timeout=1)
        ''')


def test_templates_and_users(docs):
    from abx.e2b import InvalidArgumentException, NotSupportedException

    ns = docs("https://e2b.dev/docs/sandbox-template (template names; user=)", '''
        from e2b_code_interpreter import Sandbox

        base = Sandbox.create("base")
        ci = Sandbox.create(template="code-interpreter-v1")
        out = ci.commands.run("id -u", user="user").stdout
    ''')
    # E2B's template names are local's default sandbox (the host's /usr, local's own "base")
    assert ns["base"].abx.last_info.template == ns["ci"].abx.last_info.template == "base"
    assert ns["out"].strip().isdigit()
    uid = int(ns["out"])
    if uid == 0:
        assert ns["ci"].commands.run("id -u", user="root").stdout == "0\n"
    else:
        with pytest.raises(InvalidArgumentException, match="not root"):
            ns["ci"].commands.run("id -u", user="root")
    with pytest.raises(InvalidArgumentException, match="one user"):
        ns["ci"].commands.run("id -u", user="nobody")
    # (an unknown template name is not tried here: local would try to pull it from a registry)
    from abx.e2b import Sandbox

    with pytest.raises(NotSupportedException, match=r"Nearest abx call: .*exec_stream"):
        ns["ci"].pty.create(size=None)
    with pytest.raises(InvalidArgumentException, match="host="):
        Sandbox.create(api_key="e2b_123")


def test_async_sandbox(docs):
    ns = docs("https://e2b.dev/docs/quickstart (async: AsyncSandbox)", '''
        import asyncio
        from e2b_code_interpreter import AsyncSandbox

        async def main():
            sandbox = await AsyncSandbox.create()
            seen = []

            async def on_stdout(msg):
                seen.append(msg.line)

            execution = await sandbox.run_code("print('hello'); 41 + 1", on_stdout=on_stdout)
            r = await sandbox.commands.run("echo hi")
            h = await sandbox.commands.run("sleep 0.2; echo bye", background=True, on_stdout=lambda d: seen.append(d))
            done = await h.wait()
            await sandbox.files.write("/home/user/a/b.txt", "x")
            entries = await sandbox.files.list("/home/user/a")
            running = await sandbox.is_running()
            await sandbox.kill()
            return execution, r, done, seen, entries, running, await sandbox.is_running()

        result = asyncio.run(main())
    ''')
    execution, r, done, seen, entries, running, after = ns["result"]
    assert execution.text == "42" and r.stdout == "hi\n" and done.stdout == "bye\n"
    assert seen == ["hello\n", "bye\n"] and [e.name for e in entries] == ["b.txt"]
    assert running is True and after is False


def test_async_watch_background_and_stdin(docs):
    ns = docs("https://e2b.dev/docs/filesystem/watch (async tab: watch_dir with on_event)", '''
        import asyncio
        from e2b import AsyncSandbox, CommandExitException

        async def main():
            sandbox = await AsyncSandbox.create()
            dirname = '/home/user'
            events = []

            def on_event(event):
                events.append(event)

            handle = await sandbox.files.watch_dir(dirname, on_event, recursive=True)
            await sandbox.files.write(f"{dirname}/my-folder/my-file", "hello")
            for _ in range(200):
                if any(e.name == "my-folder/my-file" for e in events):
                    break
                await asyncio.sleep(0.05)
            await handle.stop()

            command = await sandbox.commands.run("cat; sleep 30", background=True, stdin=True)
            async with sandbox.commands.stream_input(command.pid) as stdin:
                await stdin.send("typed\\n")
            for _ in range(200):
                if command.stdout:
                    break
                await asyncio.sleep(0.05)
            killed = await command.kill()
            try:
                await command.wait()
            except CommandExitException as e:
                ended = e
            return sandbox, events, command, killed, ended

        sandbox, events, command, killed, ended = asyncio.run(main())
    ''')  # (the snippet also checks stream_input and kill of the async handle)
    assert any(e.name == "my-folder/my-file" for e in ns["events"])
    assert ns["killed"] is True and ns["ended"].stdout == "typed\n" and ns["ended"].exit_code != 0


def test_background_command_outlives_its_client(docs):
    """E2B: a background command runs on after the script that started it ends."""
    import subprocess
    import sys

    ns = docs("https://e2b.dev/docs/commands/background", '''
        from e2b import Sandbox

        sandbox = Sandbox.create()
    ''')
    sb = ns["sandbox"]
    child = ("import sys\nfrom abx.e2b import Sandbox\n"
             "Sandbox.connect(sys.argv[1]).commands.run('sleep 321', background=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    subprocess.run([sys.executable, "-c", child, sb.sandbox_id], check=True, env=env, timeout=60)
    procs = sb.commands.list()
    assert [p for p in procs if "321" in p.args], procs
    assert sb.commands.kill([p for p in procs if "321" in p.args][0].pid) is True
    wait_until("sleep 321 ended", lambda: not [p for p in sb.commands.list() if "321" in p.args])


def test_class_variants_by_sandbox_id(docs):
    ns = docs("https://e2b.dev/docs/sandbox/connect (class variants: Sandbox.kill(sandbox_id) etc.)", '''
        import asyncio
        from e2b import Sandbox, AsyncSandbox

        sandbox = Sandbox.create()
        Sandbox.set_timeout(sandbox.sandbox_id, 120)
        info = Sandbox.get_info(sandbox.sandbox_id)
        paused = Sandbox.pause(sandbox.sandbox_id)
        resumed = Sandbox.connect(sandbox.sandbox_id)   # a paused sandbox is resumed on connect
        running = resumed.is_running()

        async def main():
            a = await AsyncSandbox.connect(sandbox.sandbox_id)
            out = (await a.commands.run("echo async")).stdout
            return out, await AsyncSandbox.kill(sandbox.sandbox_id), await AsyncSandbox.kill(sandbox.sandbox_id)

        out, first_kill, second_kill = asyncio.run(main())
    ''')
    left = (ns["info"].end_at - ns["info"].started_at).total_seconds()
    assert 115 <= left <= 125 + 60
    assert ns["paused"] is True and ns["running"] is True and ns["out"] == "async\n"
    assert (ns["first_kill"], ns["second_kill"]) == (True, False)
