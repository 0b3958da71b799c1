"""The check workers (peagle_runtime.check_pool): real worker processes running vLLM's request models, beside a
real event loop. A body that kills its worker or runs past the deadline is refused with a 400 and the worker
replaced; small bodies go ahead of large ones; the loop stays free throughout (timed by a ticker on it).
Faults come from a test hook (hooks/sitecustomize.py) in the workers."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from peagle_runtime.check_pool import CheckPool
from peagle_runtime.refusals import Rejection
from peagle_runtime.request_checks import Verdict

HOOKS = Path(__file__).resolve().parent / "hooks"
GOOD = json.dumps({"prompt": "x", "max_tokens": 3}).encode()


def _pool(size: int, deadline_s: float) -> CheckPool:
    env = {**os.environ, "PEAGLE_TEST_CHECK_FAULTS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOKS), os.environ.get("PYTHONPATH")]))}
    return CheckPool(size, deadline_s=deadline_s, env=env)


async def _ready(pool: CheckPool, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pool.ready():
        assert time.monotonic() < deadline, "no check worker became ready"
        await asyncio.sleep(0.1)


def test_a_body_that_kills_or_stalls_its_worker_is_refused_and_the_worker_replaced():
    async def scenario():
        pool = _pool(1, deadline_s=3.0)
        try:
            assert not pool.ready()  # importing vLLM's models takes seconds: not ready at once
            await _ready(pool)
            assert isinstance(await pool.check(route="/invocations", body=GOOD), Verdict)
            crashed = await pool.check(route="/invocations", body=b"CRASH")
            assert isinstance(await pool.check(route="/invocations", body=GOOD), Verdict)  # a new worker took over
            stalled = await pool.check(route="/invocations", body=b"SLOW0030")
            after = await pool.check(route="/invocations", body=GOOD)
            return crashed, stalled, after
        finally:
            pool.close()

    crashed, stalled, after = asyncio.run(scenario())
    assert isinstance(crashed, Rejection) and crashed.status == 400 and "stopped on it" in crashed.message
    assert isinstance(stalled, Rejection) and stalled.status == 400 and "more than 3 s" in stalled.message
    assert isinstance(after, Verdict)


def test_small_bodies_go_first_and_the_loop_never_waits():
    """One worker busy for 2 s; then a large body and a small one queue (large first): the small one is checked
    first. Meanwhile a ticker on the event loop never waits more than 100 ms for its turn."""
    async def scenario():
        pool = _pool(1, deadline_s=30.0)
        gaps: list[float] = []

        async def ticker(stop: asyncio.Event):
            last = time.monotonic()
            while not stop.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        try:
            await _ready(pool)
            stop = asyncio.Event()
            ticking = asyncio.ensure_future(ticker(stop))
            order: list[str] = []

            async def check(name: str, body: bytes):
                await pool.check(route="/invocations", body=body)
                order.append(name)

            busy = asyncio.ensure_future(check("busy", b"SLOW0002"))
            await asyncio.sleep(0.2)
            large = asyncio.ensure_future(check("large", b"SLOW0001" + b" " * (1 << 20)))
            await asyncio.sleep(0.05)
            small = asyncio.ensure_future(check("small", GOOD))
            await asyncio.gather(busy, large, small)
            stop.set()
            await ticking
            return order, max(gaps)
        finally:
            pool.close()

    order, worst_gap = asyncio.run(scenario())
    assert order == ["busy", "small", "large"]
    assert worst_gap < 0.1, worst_gap
