"""The request checks, run beside the server rather than in it: a bounded pool of worker processes.

Checking a body costs what the body makes it cost: pure-Python scans of 1 MiB of ``[]`` took 605 ms, and
the C parsers (json, pydantic, re) hold the GIL for their whole call, so neither the event loop nor a thread
can check a 6 MB body without freezing ``/ping`` and every stream with it (four such bodies kept ``/ping``
waiting 4.5 s; SageMaker replaces an instance that takes 2 s). Here the loop only hands bytes over a pipe:
:data:`DEFAULT_WORKERS` processes (:mod:`peagle_runtime.check_worker`) do the checking, at a lower CPU priority
than the server, one body at a time each, small bodies served first so that a legitimate request does not wait
behind hostile megabytes. The one exception is what costs the loop no more than vLLM's own parsing of a request
does: a body of at most :data:`INLINE_MAX_BYTES` that names no grammar (a few milliseconds at worst, parsed at C
speed and walked without recursion) is checked on the loop - the ordinary request, which a round trip to a
worker would only delay (at 16 concurrent streams on 2 CPUs the round trips staggered the requests' starts
enough to cost 5% of time per token). A check that runs past :data:`CHECK_DEADLINE_S`, or kills its worker, is refused
(400) and the worker replaced. ``/ping`` answers healthy only once a worker has been ready
(:meth:`CheckPool.ready`); workers that cannot start at all make it fail, so SageMaker replaces the instance
rather than serving unchecked.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

from peagle_runtime.check_worker import FRAME_LENGTH, framed
from peagle_runtime.refusals import Rejection
from peagle_runtime.request_checks import RequestValidator, Verdict

WORKERS_VAR = "PEAGLE_CHECK_WORKERS"
DEFAULT_WORKERS, MAX_WORKERS = 2, 16
CHECK_DEADLINE_S = 10.0
SMALL_BODY_BYTES = 64 * 1024  # bodies up to this size go ahead of larger ones
INLINE_MAX_BYTES = 16 * 1024  # ... and up to this size, naming no grammar, are checked on the loop
# A body that names one of these may carry a grammar: compiling it is the worker's, whatever the body's size.
_GRAMMAR_KEYS = (b'"structured_outputs"', b'"response_format"', b'"tools"')
MAX_FAILED_STARTS = 3  # workers that die before they are ever ready: the pool gives up (and /ping fails)


def workers_from_environment(env: Mapping[str, str]) -> int:
    """How many check workers; ValueError naming the variable when it is not an integer in range."""
    raw = env.get(WORKERS_VAR, str(DEFAULT_WORKERS)).strip()
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_WORKERS:
        raise ValueError(f"{WORKERS_VAR}: got {raw[:20]!r}; allowed: an integer in 1..{MAX_WORKERS}")
    return int(raw)


class _Late(Exception):
    pass


class _Gone(Exception):
    pass


class _Worker:
    """One worker process and its pipes; used by one thread at a time (the pool's bookkeeping sees to it)."""

    def __init__(self, command: list[str], env: Mapping[str, str]) -> None:
        self.command, self.env = command, dict(env)
        self.proc: subprocess.Popen | None = None
        self.ready = False
        self.busy = False  # a thread is using it (set and cleared on the event loop)
        self.failed_starts = 0
        self.start()

    def start(self) -> None:
        self.ready = False
        self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env)
        os.set_blocking(self.proc.stdout.fileno(), False)
        os.set_blocking(self.proc.stdin.fileno(), False)

    def poll_ready(self) -> bool:
        """Non-blocking: read the worker's ready frame if it has come; restart a worker that died starting."""
        if self.ready:
            return True
        if self.proc.poll() is not None:
            self.failed_starts += 1
            if self.failed_starts < MAX_FAILED_STARTS:
                self.start()
            return False
        if select.select([self.proc.stdout], [], [], 0)[0]:
            try:
                json.loads(self._receive(time.monotonic() + 5.0))
            except (_Late, _Gone, ValueError):
                return False
            self.ready, self.failed_starts = True, 0
        return self.ready

    @property
    def given_up(self) -> bool:
        return self.failed_starts >= MAX_FAILED_STARTS

    def roundtrip(self, route: str, body: bytes, deadline_s: float) -> Verdict | Rejection:
        end = time.monotonic() + deadline_s
        try:
            self._send([json.dumps({"route": route}).encode(), body], end)
            reply = json.loads(self._receive(end))
            forwarded = self._receive(end) if reply.get("body") else None
        except _Late:
            self.restart()
            return Rejection(400, f"request body took more than {deadline_s:g} s to check; allowed: a request "
                                  "that can be checked in that time")
        except _Gone:
            self.restart()
            return Rejection(400, "request body could not be checked (its checker stopped on it); allowed: a "
                                  "request of the OpenAI completion or chat API")
        if "rejection" in reply:
            return Rejection(*reply["rejection"])
        return Verdict(**reply["verdict"], body=forwarded)

    def restart(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.start()

    def _send(self, frames: list[bytes], end: float) -> None:
        fd = self.proc.stdin.fileno()
        data = memoryview(framed(frames))
        while data:
            if not select.select([], [fd], [], max(0.0, end - time.monotonic()))[1]:
                raise _Late()
            try:
                data = data[os.write(fd, data):]
            except BlockingIOError:
                continue
            except OSError:
                raise _Gone() from None

    def _receive(self, end: float) -> bytes:
        head = self._read(FRAME_LENGTH.size, end)
        return self._read(FRAME_LENGTH.unpack(head)[0], end)

    def _read(self, size: int, end: float) -> bytes:
        fd = self.proc.stdout.fileno()
        chunks, left = [], size
        while left:
            if not select.select([fd], [], [], max(0.0, end - time.monotonic()))[0]:
                raise _Late()
            try:
                chunk = os.read(fd, min(left, 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise _Gone()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()


class CheckPool:
    """``await pool.check(route=..., body=...)`` -> Verdict or Rejection, from one of ``size`` worker processes."""

    def __init__(self, size: int = DEFAULT_WORKERS, *, deadline_s: float = CHECK_DEADLINE_S,
                 env: Mapping[str, str] | None = None, inline: RequestValidator | None = None) -> None:
        command = [sys.executable, "-m", "peagle_runtime.check_worker"]
        self.deadline_s = deadline_s
        self.inline = inline  # checks the small bodies on the loop; None: every body goes to a worker
        self._workers = [_Worker(command, os.environ if env is None else env) for _ in range(size)]
        self._idle: list[_Worker] = []
        self._waiting: list[tuple[bool, int, asyncio.Future]] = []
        self._order = itertools.count()
        self._threads = ThreadPoolExecutor(size, thread_name_prefix="peagle-checks")
        self._watcher: asyncio.Task | None = None
        self._started = False

    def ready(self) -> bool:
        """Whether the pool serves (``/ping`` reads this): once a worker has been ready, until every worker has
        failed to start. A worker replaced after a body that stalled it is not a reason to look unhealthy - a
        client could otherwise get the instance replaced - so requests wait for its successor instead."""
        self._poll()
        self._started = self._started or any(worker.ready for worker in self._workers)
        return self._started and not self.given_up

    @property
    def given_up(self) -> bool:
        return all(worker.given_up for worker in self._workers)

    async def check(self, *, route: str, body: bytes) -> Verdict | Rejection:
        if self.inline is not None and len(body) <= INLINE_MAX_BYTES and not any(k in body for k in _GRAMMAR_KEYS):
            return self.inline.check(route=route, body=body)
        worker = await self._acquire(small=len(body) <= SMALL_BODY_BYTES)
        if worker is None:
            return Rejection(503, "the request checker is not available on this instance", type="ServiceUnavailable",
                             retry_after=1)
        worker.busy = True
        done = asyncio.get_running_loop().run_in_executor(self._threads, worker.roundtrip, route, body, self.deadline_s)
        done.add_done_callback(lambda _: self._release(worker))  # only once the worker is really free
        return await asyncio.shield(done)

    async def _acquire(self, *, small: bool) -> _Worker | None:
        self._poll()
        if self._idle and not self._waiting:
            return self._idle.pop()
        if self.given_up:
            return None
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (not small, next(self._order), waiter))
        self._watch()
        return await waiter

    def _release(self, worker: _Worker) -> None:
        worker.busy = False
        if worker.ready:
            self._idle.append(worker)
            self._hand_out()
        else:
            self._watch()  # it was replaced: its successor must say it is ready first

    def _hand_out(self) -> None:
        while self._waiting and (self._idle or self.given_up):
            _, _, waiter = heapq.heappop(self._waiting)
            if waiter.done():
                continue  # its request was cancelled while it waited
            waiter.set_result(self._idle.pop() if self._idle else None)

    def _poll(self) -> None:
        for worker in self._workers:
            if not worker.busy and not worker.ready and worker.poll_ready():
                self._idle.append(worker)

    def _watch(self) -> None:
        """Until every worker is ready: look every 50 ms and hand newly ready ones to whoever waits."""
        async def watch() -> None:
            while not all(w.ready or w.given_up for w in self._workers):
                await asyncio.sleep(0.05)
                self._poll()
                self._hand_out()
            self._hand_out()

        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(watch())

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._threads.shutdown(wait=False)


class InlineChecks:
    """The same interface over a validator in this process, run in a thread: for tests of the middleware."""

    def __init__(self, validator: RequestValidator) -> None:
        self.validator = validator

    def ready(self) -> bool:
        return True

    async def check(self, *, route: str, body: bytes) -> Verdict | Rejection:
        return await asyncio.to_thread(self.validator.check, route=route, body=body)

    def close(self) -> None:
        pass
