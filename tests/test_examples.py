"""The examples run and print what they promise, and README's code is true.

The model-loop examples run against fake async clients shaped like the SDKs' own (the SDKs
are not installed in the test environment, and no test reaches a network). Each fake
scripts one conversation: ``spawn_agent``, a turn that ends while the child runs (the
loop then hands the model the child's result), ``wait_agent``, a final answer. During the
second model call the fake waits for the background child to make progress, so a loop
that blocks the event loop for the length of a model call fails the test instead of
passing slowly. Other scripts check that every loop ends: a model that never asks for
the result, and one that never stops calling tools.

README rule: every ```python block either runs as printed (it is executed here, in a
fresh interpreter) or is an excerpt of a complete example: its first line is
``# examples/<file>.py`` and the rest appears, verbatim and contiguous, in that file, which
a test below runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from subagents import AgentSpec, Request, RunContext, SubagentManager
from subagents.tools import Toolset, build_tools

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TASK_ID = re.compile(r"task ([0-9a-f]{12})")


def run_example(name: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def load_example(name: str) -> ModuleType:
    path = ROOT / "examples" / name
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_agent_loop_example() -> None:
    out = run_example("agent_loop.py")
    for topic in ("anyio", "trio", "asyncio"):
        assert f"/root/{topic} [completed] notes on '{topic}'" in out
    assert "collected 3 results" in out


# ---------------------------------------------------------------- the model-loop examples

FINAL = "All notes are in; here is the report."


class Script:
    """The model's side of one conversation, provider-neutral.

    ``turn(outputs, notes)`` gets the tool outputs and the user messages after the task
    (the loop's reports of finished children) sent so far, and returns the next reply: a
    ``(tool, arguments)`` call or a text that ends the turn. The second call
    waits, inside the model call, for the background child to make progress; a loop that
    blocks the event loop never lets the child run, and the wait times out.
    """

    def __init__(self) -> None:
        self.model_calling = anyio.Event()
        self.child_progressed = anyio.Event()
        self.calls = 0
        self.waited: str | None = None

    async def researcher(self, request: Request, ctx: RunContext) -> str:
        await self.model_calling.wait()
        self.child_progressed.set()
        return f"notes on {request.input}"

    async def turn(self, outputs: list[str], notes: list[str]) -> tuple[str, dict[str, Any]] | str:
        self.calls += 1
        if self.calls == 1:
            return ("spawn_agent", {"agent": "researcher", "input": "anyio"})
        if self.calls == 2:
            assert len(outputs) == 1, outputs
            assert notes == [], notes
            self.model_calling.set()
            with anyio.fail_after(5):
                await self.child_progressed.wait()
            return "The researcher is working; I will collect its notes when it is done."
        if self.calls == 3:
            # The loop woke on the child's end and reported it; a model may still ask.
            [note] = notes
            assert "status: completed" in note, note
            assert "notes on anyio" in note, note
            task_ids = TASK_ID.findall(outputs[0])
            assert len(task_ids) == 1, outputs
            return ("wait_agent", {"task_ids": task_ids, "mode": "all", "timeout_ms": 5000})
        if self.calls == 4:
            self.waited = outputs[-1]
            return FINAL
        raise AssertionError(f"unexpected model call #{self.calls}")

    def assert_done(self) -> None:
        assert self.calls == 4, f"{self.calls} model calls, 4 scripted"
        assert self.waited is not None
        assert "status: completed" in self.waited, self.waited
        assert "notes on anyio" in self.waited, self.waited


def user_notes(messages: list[Any]) -> list[str]:
    """The text messages a loop sent as the user after the task (its wake-up reports)."""
    texts = [
        m["content"]
        for m in messages
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m["content"], str)
    ]
    return texts[1:]


class FakeChatClient:
    """``AsyncOpenAI`` as far as Chat Completions goes: ``chat.completions.create``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, *, model: str, messages: list[Any], tools: list[Any]) -> Any:
        assert {tool["function"]["name"] for tool in tools} >= {"spawn_agent", "wait_agent"}
        outputs = [m["content"] for m in messages if isinstance(m, dict) and m["role"] == "tool"]
        reply = await self.script.turn(outputs, user_notes(messages))
        if isinstance(reply, str):
            message = SimpleNamespace(role="assistant", content=reply, tool_calls=None)
        else:
            function = SimpleNamespace(name=reply[0], arguments=json.dumps(reply[1]))
            call = SimpleNamespace(id=f"call_{self.script.calls}", function=function)
            message = SimpleNamespace(role="assistant", content=None, tool_calls=[call])
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


class FakeResponsesClient:
    """``AsyncOpenAI`` as far as the Responses API goes: ``responses.create``.

    Each reply's output carries a reasoning item before its function call, as reasoning
    models' replies do; ``inputs`` keeps the ``input`` list of every call.
    """

    def __init__(self, script: Script) -> None:
        self.script = script
        self.responses = SimpleNamespace(create=self.create)
        self.inputs: list[list[Any]] = []

    async def create(self, *, model: str, input: list[Any], tools: list[Any]) -> Any:
        assert {tool["name"] for tool in tools} >= {"spawn_agent", "wait_agent"}
        self.inputs.append(list(input))
        outputs = [
            item["output"]
            for item in input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        reply = await self.script.turn(outputs, user_notes(input))
        n = self.script.calls
        if isinstance(reply, str):
            message = SimpleNamespace(type="message", role="assistant", id=f"msg_{n}")
            return SimpleNamespace(output=[message], output_text=reply)
        reasoning = SimpleNamespace(type="reasoning", id=f"rs_{n}", summary=[])
        call = SimpleNamespace(
            type="function_call",
            id=f"fc_{n}",
            call_id=f"call_{n}",
            name=reply[0],
            arguments=json.dumps(reply[1]),
        )
        return SimpleNamespace(output=[reasoning, call], output_text="")

    def assert_outputs_follow_their_calls(self) -> None:
        """Every ``function_call_output`` comes after its ``function_call`` and that
        reply's reasoning item, as the Responses API requires."""
        answered = 0
        for items in self.inputs:
            for index, item in enumerate(items):
                if not (isinstance(item, dict) and item.get("type") == "function_call_output"):
                    continue
                before = items[:index]
                calls = [
                    i
                    for i, x in enumerate(before)
                    if getattr(x, "type", None) == "function_call" and x.call_id == item["call_id"]
                ]
                assert calls, f"{item['call_id']}'s output is sent without its call: {items}"
                reasoning = f"rs_{item['call_id'].removeprefix('call_')}"
                assert any(getattr(x, "id", None) == reasoning for x in before[: calls[0]]), (
                    f"the reasoning item {reasoning} is missing before its call: {items}"
                )
                answered += 1
        assert answered >= 2, self.inputs


class FakeAnthropicClient:
    """``AsyncAnthropic`` as far as the Messages API goes: ``messages.create``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.messages = SimpleNamespace(create=self.create)

    async def create(
        self, *, model: str, max_tokens: int, messages: list[Any], tools: list[Any]
    ) -> Any:
        assert {tool["name"] for tool in tools} >= {"spawn_agent", "wait_agent"}
        outputs = [
            block["content"]
            for message in messages
            if message["role"] == "user" and isinstance(message["content"], list)
            for block in message["content"]
            if block["type"] == "tool_result"
        ]
        reply = await self.script.turn(outputs, user_notes(messages))
        if isinstance(reply, str):
            return SimpleNamespace(content=[SimpleNamespace(type="text", text=reply)])
        use = SimpleNamespace(
            type="tool_use", id=f"toolu_{self.script.calls}", name=reply[0], input=reply[1]
        )
        return SimpleNamespace(content=[SimpleNamespace(type="text", text="On it."), use])


# example file, its loop function, the fake client, the SDK module and client class main uses
LOOPS: dict[str, tuple[str, Callable[[Script], Any], str, str]] = {
    "openai_chat_loop.py": ("chat_loop", FakeChatClient, "openai", "AsyncOpenAI"),
    "openai_responses_loop.py": ("responses_loop", FakeResponsesClient, "openai", "AsyncOpenAI"),
    "anthropic_loop.py": ("anthropic_loop", FakeAnthropicClient, "anthropic", "AsyncAnthropic"),
}


# Every example some test here runs: a README excerpt must come from one of them.
TESTED_EXAMPLES = {
    *LOOPS,
    "agent_loop.py",
    "phoenix.py",
    "ray_cluster.py",
}  # phoenix.py: tests/test_example_phoenix.py; ray_cluster.py: tests/backends/ray/


def check_client(client: Any) -> None:
    if isinstance(client, FakeResponsesClient):
        client.assert_outputs_follow_their_calls()


@pytest.mark.anyio
@pytest.mark.parametrize("example", list(LOOPS))
async def test_model_loop_lets_children_run_during_model_calls(example: str) -> None:
    function, fake, _, _ = LOOPS[example]
    loop = getattr(load_example(example), function)
    script = Script()
    client = fake(script)
    agents = [AgentSpec(name="researcher", description="Takes notes.", runner=script.researcher)]
    async with SubagentManager(agents) as manager:
        toolset: Toolset = build_tools(manager, "root", engine_tool_timeout=60.0)
        with anyio.fail_after(20):
            answer = await loop(client, toolset, "Research anyio.", model="fake-model")
        assert manager.statistics().settled == 1
    assert answer == FINAL
    script.assert_done()
    check_client(client)


@pytest.mark.anyio
@pytest.mark.parametrize("example", list(LOOPS))
async def test_model_loop_example_main_runs_with_its_sdk(
    example: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``main()`` as printed, with the SDK module replaced by one handing out the fake."""
    _, fake, sdk, client_class = LOOPS[example]
    module = load_example(example)
    script = Script()
    clients: list[Any] = []

    def make_client() -> Any:
        clients.append(fake(script))
        return clients[-1]

    monkeypatch.setitem(sys.modules, sdk, SimpleNamespace(**{client_class: make_client}))
    monkeypatch.setattr(module, "researcher", script.researcher)
    with anyio.fail_after(20):
        await module.main("Research anyio.")
    assert capsys.readouterr().out == FINAL + "\n"
    assert len(clients) == 1
    script.assert_done()
    check_client(clients[0])


class AnswersWithoutWaiting(Script):
    """Spawns once, then only ever answers in text: it never calls ``wait_agent``."""

    async def researcher(self, request: Request, ctx: RunContext) -> str:
        await anyio.sleep(0.01)
        return f"notes on {request.input}"

    async def turn(self, outputs: list[str], notes: list[str]) -> tuple[str, dict[str, Any]] | str:
        # A model call yields: a loop that never ends then times out instead of hanging.
        await anyio.lowlevel.checkpoint()
        self.calls += 1
        if self.calls == 1:
            return ("spawn_agent", {"agent": "researcher", "input": "anyio"})
        self.waited = "\n".join(notes)
        return f"answer {self.calls}"


class NeverStops(Script):
    """Calls a tool on every turn, forever."""

    async def turn(self, outputs: list[str], notes: list[str]) -> tuple[str, dict[str, Any]] | str:
        await anyio.lowlevel.checkpoint()
        self.calls += 1
        return ("list_agents", {})


@pytest.mark.anyio
@pytest.mark.parametrize("example", list(LOOPS))
async def test_model_loop_ends_when_the_model_never_collects_what_it_spawned(
    example: str,
) -> None:
    """The loop reports the finished child once, collecting it, so the next text-only turn
    finds nothing left to wait for: three model calls, not one per wake-up forever."""
    function, fake, _, _ = LOOPS[example]
    loop = getattr(load_example(example), function)
    script = AnswersWithoutWaiting()
    agents = [AgentSpec(name="researcher", description="Takes notes.", runner=script.researcher)]
    async with SubagentManager(agents) as manager:
        toolset: Toolset = build_tools(manager, "root", engine_tool_timeout=60.0)
        with anyio.fail_after(5):
            answer = await loop(fake(script), toolset, "Research anyio.", model="fake-model")
        [handle] = manager.tasks("root")
        assert handle.collected
    assert (answer, script.calls) == ("answer 3", 3)
    assert script.waited is not None
    assert "status: completed" in script.waited
    assert "notes on anyio" in script.waited


@pytest.mark.anyio
@pytest.mark.parametrize("example", list(LOOPS))
async def test_model_loop_stops_after_max_turns(example: str) -> None:
    function, fake, _, _ = LOOPS[example]
    loop = getattr(load_example(example), function)
    script = NeverStops()
    async with SubagentManager([]) as manager:
        toolset: Toolset = build_tools(manager, "root", engine_tool_timeout=60.0)
        with anyio.fail_after(5):
            answer = await loop(fake(script), toolset, "Loop.", model="fake-model", max_turns=4)
    assert script.calls == 4
    assert answer == "[stopped: no final answer within 4 model turns]"


# ---------------------------------------------------------------- README


def readme_blocks(language: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced block of ``language`` in README.md."""
    blocks = []
    lines = README.read_text(encoding="utf-8").splitlines()
    start = None
    for number, line in enumerate(lines, 1):
        if start is None and line.strip() == f"```{language}":
            start = number
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(lines[start : number - 1]) + "\n"))
            start = None
    assert start is None, f"README.md:{start}: unclosed code block"
    return blocks


EXCERPT = re.compile(r"# (examples/[\w.-]+\.py)\n")
PYTHON_BLOCKS = readme_blocks("python")


def test_readme_has_python_blocks() -> None:
    assert len(PYTHON_BLOCKS) >= 5


def test_readme_excerpts_are_in_examples_that_tests_run() -> None:
    excerpts = 0
    for line, code in PYTHON_BLOCKS:
        found = EXCERPT.match(code)
        if found is None:
            continue
        excerpts += 1
        path = ROOT / found[1]
        assert path.is_file(), f"README.md:{line}: {found[1]} does not exist"
        assert path.name in TESTED_EXAMPLES, f"README.md:{line}: no test runs {found[1]}"
        excerpt = textwrap.dedent(code[found.end() :])
        source = path.read_text(encoding="utf-8")
        assert any(
            textwrap.indent(excerpt, " " * indent) in source for indent in range(0, 17, 4)
        ), f"README.md:{line}: the block differs from {found[1]}"
    assert excerpts >= 3


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(code, id=f"line{line}")
        for line, code in PYTHON_BLOCKS
        if not EXCERPT.match(code)
    ],
)
def test_readme_python_block_runs_as_printed(code: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, f"{code}\n{done.stderr}"


def _readme_block(heading: str) -> str:
    section = README.read_text(encoding="utf-8").split(heading, 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_readme_quick_start_prints_the_notes_of_each_topic(tmp_path: Path, backend: str) -> None:
    code = _readme_block("## Quick start")
    assert len(code.strip().splitlines()) <= 20
    if backend == "trio":
        code = code.replace("anyio.run(main)", 'anyio.run(main, backend="trio")')
    script = tmp_path / "quick_start.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    for topic in ("anyio", "trio", "attrs"):
        assert f"notes on {topic}" in out.stdout
    assert out.stdout.count("status: completed") == 3


def test_readme_starts_with_the_demo_and_the_ci_test_command() -> None:
    """README opens with two commands: install and run the demo, then run the tests; the
    second is what ``.ci/run`` runs on every interpreter."""
    text = README.read_text(encoding="utf-8")
    first = text.index("```")
    assert not re.sub(r"^# .*\n", "", text[:first]).strip(), "README starts with prose"
    line, block = readme_blocks("bash")[0]
    assert text[first:].startswith("```bash\n"), "README's first block is not bash"
    commands = block.splitlines()
    assert len(commands) == 2, f"README.md:{line}: {commands}"
    demo, tests = commands
    assert demo.startswith("python3 -m venv .venv && . .venv/bin/activate && "), demo
    assert demo.endswith("&& subagents demo"), demo
    assert tests.endswith("python -m pytest -q"), tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    found = re.search(r"^TEST_COMMAND=(.*)$", ci, re.MULTILINE)
    assert found is not None, ".ci/run has no TEST_COMMAND"
    assert shlex.split(found[1]) == [tests], (found[1], tests)


def test_supported_pythons_agree() -> None:
    """README, the pyproject classifiers and the interpreters ``.ci/run`` tests name the
    same versions."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    prefix = "Programming Language :: Python :: "
    versions = [
        c.removeprefix(prefix)
        for c in project["classifiers"]
        if re.fullmatch(re.escape(prefix) + r"3\.\d+", c)
    ]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    found = re.search(r"^VERSIONS=\((.*)\)$", ci, re.MULTILINE)
    assert found is not None, ".ci/run has no VERSIONS"
    assert found[1].split() == versions
    assert project["requires-python"] == f">={versions[0]}"
    readme = README.read_text(encoding="utf-8")
    named = ", ".join(versions[:-1]) + f" and {versions[-1]}"
    assert f"Supported: Python {named}" in readme
