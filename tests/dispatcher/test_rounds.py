"""Rounds: the senders' queue (dispatcher/dispatch/rounds.py). Endpoints are served in
turn, each endpoint's effects in their order, and no effect is lost or handed out twice,
whatever the senders do: wait, get woken, get cancelled while waiting or just after being
woken (a stopping worker cancels its senders)."""

from __future__ import annotations

import asyncio
import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_outbox.dispatch.rounds import Rounds


@dataclasses.dataclass(frozen=True)
class Effect:
    endpoint: str
    n: int


def test_endpoints_take_turns_and_each_keeps_its_order() -> None:
    async def main() -> list[Effect]:
        rounds: Rounds[Effect] = Rounds()
        for n in range(4):
            rounds.put_nowait(Effect("backlog", n))
        rounds.put_nowait(Effect("fresh", 0))
        rounds.put_nowait(Effect("other", 0))
        return [await rounds.get() for _ in range(6)]

    got = asyncio.run(main())
    # The fresh effect waits for one of the backlog's, not for all four.
    assert [(e.endpoint, e.n) for e in got] == [
        ("backlog", 0),
        ("fresh", 0),
        ("other", 0),
        ("backlog", 1),
        ("backlog", 2),
        ("backlog", 3),
    ]


def test_a_waiting_sender_is_woken_by_a_put_and_a_cancelled_one_loses_nothing() -> None:
    async def main() -> tuple[Effect, int]:
        rounds: Rounds[Effect] = Rounds()
        first = asyncio.ensure_future(rounds.get())
        second = asyncio.ensure_future(rounds.get())
        await asyncio.sleep(0)  # both wait
        rounds.put_nowait(Effect("a", 1))  # wakes the first...
        first.cancel()  # ... which is cancelled before it runs
        got = await asyncio.wait_for(second, 1.0)  # the wake-up went on to the second
        return got, rounds.qsize()

    got, left = asyncio.run(main())
    assert got == Effect("a", 1) and left == 0


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from("abc")),
        st.tuples(st.just("getter"), st.just("")),
        st.tuples(st.just("cancel"), st.integers(0, 3)),
        st.tuples(st.just("run"), st.just("")),
    ),
    max_size=40,
)


@settings(max_examples=1000, deadline=None)
@given(ops)
def test_every_effect_is_taken_once_or_still_waiting_whatever_the_senders_do(
    steps: list[tuple[str, object]],
) -> None:
    async def main() -> None:
        rounds: Rounds[Effect] = Rounds()
        getters: list[asyncio.Future[Effect]] = []
        put: list[Effect] = []
        for op, arg in steps:
            if op == "put":
                put.append(Effect(str(arg), len(put)))
                rounds.put_nowait(put[-1])
            elif op == "getter":
                getters.append(asyncio.ensure_future(rounds.get()))
            elif op == "cancel" and getters:
                getters[int(str(arg)) % len(getters)].cancel()
            if op == "run":
                await asyncio.sleep(0)
        for _ in range(3):
            await asyncio.sleep(0)
        taken = [g.result() for g in getters if g.done() and not g.cancelled()]
        waiting = [g for g in getters if not g.done()]
        # Nothing is handed out twice; what was not taken is still in the lines; and
        # no sender waits while an effect does (the wake-ups reached someone).
        assert len(taken) == len(set(taken))
        assert rounds.qsize() == len(put) - len(taken)
        assert not (waiting and rounds.qsize())
        rest = [await rounds.get() for _ in range(rounds.qsize())]
        assert sorted(e.n for e in taken + rest) == [e.n for e in put]
        for endpoint in "abc":  # each endpoint's effects in their order
            order = [e.n for e in rest if e.endpoint == endpoint]
            assert order == sorted(order)
        for g in waiting:
            g.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    asyncio.run(main())
