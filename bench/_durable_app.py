"""The application of bench/durable.py: one in-call tool and one durable tool, same effect.

The effect is the provider's latency (``BENCH_EFFECT_SECS``, real seconds, default 0.2): what
a worker waits on, so that workers add throughput the way they would against a real API.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pipecat_actions import ActionContext, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.operator import OperatorApp
from pipecat_actions.policy import load_policy_text

POLICY = load_policy_text("""
version: 1
tools:
  pay_in_call:
    kind: mutation
    deadline_secs: 3600
  pay_durably:
    kind: mutation
    mode: background
    execution: durable
    deadline_secs: 3600
    durable: {worker_concurrency: 8}
""")


async def _effect(ctx: ActionContext) -> dict[str, Any]:
    await asyncio.sleep(float(os.environ.get("BENCH_EFFECT_SECS", "0.2")))
    return {"paid": ctx.operation_id}


@action
async def pay_in_call(ctx: ActionContext, n: int) -> dict[str, Any]:
    """Pay, in the call's process."""
    return await _effect(ctx)


@action
async def pay_durably(ctx: ActionContext, n: int) -> dict[str, Any]:
    """Pay, on a DBOS worker."""
    return await _effect(ctx)


ACTIONS = [pay_in_call, pay_durably]


def app() -> OperatorApp:
    return OperatorApp(policy=POLICY, actions=ACTIONS, authorizer=AllowAll())
