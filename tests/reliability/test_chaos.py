"""Chaos fan-out: thousands of spawns with random faults and random interference.

``SUBAGENTS_SOAK=100000`` turns the fan-out into the long soak (``-s`` prints the summary);
``SUBAGENTS_CHAOS_SEED`` replays a seed named in a failure message.
"""

from __future__ import annotations

import pytest

from .chaos import Chaos, scaled

pytestmark = pytest.mark.anyio


async def test_chaos_fan_out_keeps_every_invariant() -> None:
    chaos = Chaos(spawns=scaled(3000), budget=max(60.0, scaled(3000) / 200))
    summary = await chaos.run()
    print(summary.render())
    chaos.assert_ok()
    # The run exercised what it claims to: every fault ended in its own status somewhere.
    for fault, statuses in summary.by_fault.items():
        assert statuses, (chaos.seed, fault)
    assert summary.operations.get("cancel_random", 0) > 0, chaos.seed
    assert summary.operations.get("resize", 0) > 0, chaos.seed
    assert summary.operations.get("wait_returned", 0) > 0, chaos.seed


async def test_chaos_with_tiny_expiring_mailboxes_loses_nothing() -> None:
    """Mailboxes of 4 entries that expire after 5 ms: envelopes overflow and vanish from
    mailboxes all the time, yet every one stays obtainable (invariants as above)."""
    chaos = Chaos(spawns=scaled(1000) // 3, mailbox_capacity=4, mailbox_ttl=0.005)
    summary = await chaos.run()
    print(summary.render())
    chaos.assert_ok()
    assert summary.operations.get("wait_returned", 0) > 0, chaos.seed


async def test_chaos_with_nested_parents_waiting_for_their_children() -> None:
    """Nested parents block on each child while holding their slot. Until slot lending
    lands, only the resizer raising the limit (and cancels) let such trees through at a
    limit of 1; with it, they must pass at any limit."""
    chaos = Chaos(spawns=scaled(1000) // 2, nested_waits=True)
    summary = await chaos.run()
    print(summary.render())
    chaos.assert_ok()
