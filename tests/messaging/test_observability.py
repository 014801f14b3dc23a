"""subagent.message events carry receipts (bodies only under capture_content); a reply's
tool span links to the span of the agent whose message it answers."""

from __future__ import annotations

import anyio
import pytest

from subagents import Event, Request, RunContext, SubagentConfig, SubagentManager
from subagents._events import MESSAGE
from subagents.tools import build_tools
from tests.messaging.support import Gate, spec
from tests.otel_support import Otel

pytestmark = pytest.mark.anyio


async def _asker(request: Request, ctx: RunContext) -> str:
    reply = await ctx.ask("/root", "what is the secret?", timeout=10)
    return reply.outcome


@pytest.mark.parametrize("capture", [False, True])
async def test_every_send_and_receipt_change_is_an_event(capture: bool) -> None:
    events: list[Event] = []
    config = SubagentConfig(capture_content=capture)
    async with SubagentManager([spec("asker", _asker)], config=config) as manager:
        manager.events.subscribe(lambda e: events.append(e) if e.type == MESSAGE else None)
        child = manager.spawn("asker")
        question = await manager.recv(timeout=10)
        assert question is not None
        manager.send(child.task_id, "swordfish", reply_to=question.id)
        assert (await child.wait()).output == "replied"
    sends = [e for e in events if e.data["action"] == "send"]
    assert [e.task_id for e in sends] == [child.task_id, "root"]
    for event in sends:
        message = event.data["message"]
        assert isinstance(message, dict)
        assert ("body" in message) is capture
        assert event.data["receipt"]["message_id"] == message["id"]  # type: ignore[index]
    assert sends[1].data["message"]["reply_to"] == question.id  # type: ignore[index]
    states = [
        e.data["receipt"]["state"]  # type: ignore[index]
        for e in events
        if e.data["receipt"]["message_id"] == question.id  # type: ignore[index]
    ]
    assert states == ["queued", "read", "replied"]
    bodies = [str(e.to_dict()) for e in events]
    assert any("swordfish" in b for b in bodies) is capture


async def test_a_replys_span_links_to_the_span_of_the_agent_it_answers(otel: Otel) -> None:
    manager = otel.install(SubagentManager([spec("asker", _asker)]))
    async with manager:
        child = manager.spawn("asker")
        question = await manager.recv(timeout=10)
        assert question is not None
        tools = build_tools(manager, "root", messaging=True)
        answer = {"to": child.task_id, "message": "42", "reply_to": question.id}
        assert not (await tools.call("send_message", answer)).is_error
        await child.wait()
    spans = otel.finished()
    [agent] = [s for s in spans if s.name == "invoke_agent asker"]
    [tool] = [s for s in spans if s.name == "execute_tool send_message"]
    assert tool.attributes is not None
    assert tool.attributes["subagents.reply_to"] == question.id
    assert [link.context.span_id for link in tool.links] == [agent.context.span_id]  # type: ignore[union-attr]


async def test_a_python_api_reply_links_the_repliers_span_to_the_askers(otel: Otel) -> None:
    async def replier(request: Request, ctx: RunContext) -> str:
        message = await ctx.recv(timeout=10)
        assert message is not None
        ctx.send(message.from_, "42", reply_to=message.id)
        return message.id

    async def asker(request: Request, ctx: RunContext) -> str:
        return (await ctx.ask("/root/replier", "the answer?", timeout=10)).outcome

    manager = otel.install(SubagentManager([spec("asker", asker), spec("replier", replier)]))
    async with manager:
        answering = manager.spawn("replier")
        asking = manager.spawn("asker")
        assert (await asking.wait()).output == "replied"
        question_id = (await answering.wait()).output
    spans = {s.name: s for s in otel.finished()}
    asker_span, replier_span = spans["invoke_agent asker"], spans["invoke_agent replier"]
    [link] = replier_span.links
    assert link.context.span_id == asker_span.context.span_id  # type: ignore[union-attr]
    attributes = dict(link.attributes or {})
    assert attributes["subagents.reply_to"] == question_id
    assert attributes["subagents.task_id"] == asking.task_id


async def test_a_reply_sent_to_a_third_agent_links_no_span(otel: Otel) -> None:
    """The link goes to the question's asker: a message with ``reply_to`` sent to someone
    else links the replier's span to nobody's (not to that third agent's)."""
    gate = anyio.Event()

    async def replier(request: Request, ctx: RunContext) -> str:
        message = await ctx.recv(timeout=10)
        assert message is not None
        ctx.send("/root/bystander", "42", reply_to=message.id)
        return "sent"

    async def bystander(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "done"

    agents = [spec("replier", replier), spec("bystander", bystander)]
    manager = otel.install(SubagentManager(agents))
    async with manager:
        answering = manager.spawn("replier")
        watching = manager.spawn("bystander")
        manager.send(answering.task_id, "the answer?")
        await answering.wait()
        gate.set()
        await watching.wait()
    spans = {s.name: s for s in otel.finished()}
    assert spans["invoke_agent replier"].links == ()


async def test_a_revived_runs_span_links_to_the_run_it_revives(otel: Otel) -> None:
    async def memo(request: Request, ctx: RunContext) -> str:
        return "ok"

    manager = otel.install(SubagentManager([spec("memo", memo, resumable=True)]))
    async with manager:
        first = manager.spawn("memo")
        await first.wait()
        receipt = manager.send(first.task_id, "again")
        assert receipt.task_id is not None
        await manager.handle(receipt.task_id).wait()
    runs = [s for s in otel.finished() if s.name == "invoke_agent memo"]
    [old] = [s for s in runs if not s.links]
    [new] = [s for s in runs if s.links]
    [link] = new.links
    assert link.context.span_id == old.context.span_id  # type: ignore[union-attr]
    assert dict(link.attributes or {})["subagents.task_id"] == first.task_id


async def test_a_body_stays_out_of_the_tool_span_without_capture_content(otel: Otel) -> None:
    gate = Gate()
    manager = otel.install(SubagentManager([spec("p", gate.parked("p"))]))
    async with manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        tools = build_tools(manager, "root", messaging=True)
        body = "SECRET-" + "x" * 16_000  # one character too many
        result = await tools.call("send_message", {"to": child.task_id, "message": body})
        assert result.is_error
        gate.open.set()
    for span in otel.finished():
        texts = [str(span.attributes), str(span.status.description)]
        texts += [str(e.attributes) for e in span.events]
        assert not any("SECRET" in t for t in texts), span.name
