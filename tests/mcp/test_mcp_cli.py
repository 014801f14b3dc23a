"""``subagents mcp serve`` as a command: ``--agents MODULE:NAME`` and its errors (one line
on stderr, never a traceback), a store that cannot be opened, and the SDK imported only by
this command (``import subagents`` and every other command work without it)."""

from __future__ import annotations

import errno
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from subagents._cli import main
from subagents._cli_specs import SpecsError, load_specs
from tests.mcp import agents

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("SPECS", agents.SPECS),
        ("SLEEPER", [agents.SLEEPER]),
        ("BY_NAME", agents.SPECS),
        ("make", agents.SPECS),
    ],
)
def test_agents_names_a_spec_a_list_a_mapping_or_a_factory(name: str, expected: object) -> None:
    assert load_specs(f"tests.mcp.agents:{name}") == expected


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("tests.mcp.agents:MISSING", "tests.mcp.agents:MISSING: 'MISSING' not found"),
        (
            "tests.mcp.agents:NOT_SPECS",
            "tests.mcp.agents:NOT_SPECS is of type int, not an AgentSpec",
        ),
        ("tests.mcp.agents:MIXED", "tests.mcp.agents:MIXED[1] is of type str, not an AgentSpec"),
        ("tests.mcp.agents:NONE", "tests.mcp.agents:NONE holds no AgentSpec"),
        ("tests.mcp.agents:broken", "tests.mcp.agents:broken() raised RuntimeError: no agents"),
        ("tests.mcp.nowhere:SPECS", "cannot import 'tests.mcp.nowhere': ModuleNotFoundError"),
        (
            "tests.mcp.agents:make_async",
            "tests.mcp.agents:make_async is an async function: the factory must be a plain one",
        ),
        (
            "tests.mcp.agents:returns_awaitable",
            "tests.mcp.agents:returns_awaitable() returned an awaitable",
        ),
    ],
)
def test_agents_that_name_no_specs_say_why(
    reference: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SpecsError, match="^" + re.escape(message)):
        load_specs(reference)
    assert main(["mcp", "serve", "--agents", reference]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"subagents mcp serve: --agents: {message}")
    assert err.count("\n") == 1


def test_what_the_agents_module_prints_goes_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "printingagents.py").write_text(
        "from tests.mcp.agents import noisy\n\nprint('importing the agents')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_specs("printingagents:noisy") == agents.SPECS
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "importing the agents\nbuilding the specs\n"


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--session", "", "argument --session: must not be empty"),
        ("--port", "65536", "argument --port: must be from 0 to 65535, got 65536"),
        ("--port", "-1", "argument --port: must be from 0 to 65535, got -1"),
        ("--port", "http", "argument --port: not an integer: 'http'"),
        ("--wait-cap", "600.5", "argument --wait-cap: must be at most 600 seconds, got 600.5"),
        ("--wait-cap", "0", "argument --wait-cap: must be a positive number of seconds"),
        (
            "--progress-every",
            "0.01",
            "argument --progress-every: must be at least 0.05 seconds, got 0.01",
        ),
    ],
)
def test_a_bad_option_value_is_a_usage_error_naming_it(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["mcp", "serve", "--agents", "tests.mcp.agents:SPECS", option, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_a_port_in_use_is_status_1_naming_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        status = main(
            [
                "mcp",
                "serve",
                "--agents",
                "tests.mcp.agents:SPECS",
                "--transport",
                "streamable-http",
                "--port",
                str(port),
            ]
        )
    assert status == 1
    err = capsys.readouterr().err
    assert err.startswith(f"subagents mcp serve: [Errno {errno.EADDRINUSE}] cannot listen on ")
    assert f"127.0.0.1:{port}: " in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("reference", ["agents", "agents:", ":SPECS"])
def test_agents_without_module_and_name_is_a_usage_error(
    reference: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["mcp", "serve", "--agents", reference])
    assert exited.value.code == 2
    assert "expected MODULE:NAME" in capsys.readouterr().err


def test_a_file_that_is_not_a_store_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    status = main(["mcp", "serve", "--agents", "tests.mcp.agents:SPECS", "--store", str(path)])
    assert status == 1
    err = capsys.readouterr().err
    assert err.startswith("subagents mcp serve: ")
    assert str(path) in err
    assert err.count("\n") == 1
    assert path.read_text() == "not a database\n" * 100


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )


def test_importing_the_package_and_its_command_line_never_imports_the_sdk() -> None:
    run = _python(
        "import sys, subagents, subagents.tools, subagents.testing, subagents._cli\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types'))\n"
        "print(loaded)\n"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "[]\n"


def test_without_the_sdk_the_command_says_how_to_install_it() -> None:
    run = _python(
        "import sys\n"
        "sys.modules['mcp'] = None  # as if the extra were not installed\n"
        "from subagents._cli import main\n"
        "sys.exit(main(['mcp', 'serve', '--agents', 'tests.mcp.agents:SPECS']))\n"
    )
    assert run.returncode == 1
    assert run.stderr.startswith("subagents mcp serve: needs the MCP SDK")
    assert "pip install 'subagents[mcp]'" in run.stderr
    assert run.stderr.count("\n") == 1
