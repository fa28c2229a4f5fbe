"""``algorithm.slot``: continuous batching's admissions and a decode's timing (the loops' exactness is
tests/test_engine.py's, test_batch.py's and test_jacobi.py's).

- ``SlotStream`` fills every slot in stream order, hands a prompt that is complete at admission on at once, refills a
  finished slot with the next prompt, and idles a slot when the stream is dry;
- ``Timing`` turns a single-prompt cycle's four marks into drafting and verify spans, and its result carries the
  latency taken at ``stop``;
- ``decides_on_host`` is ``engine.acceptance``'s rule.
"""

from __future__ import annotations

import torch

from adtbench.algorithm.records import Clock
from adtbench.algorithm.slot import SlotStream, Timing, decides_on_host


def test_slot_stream_admits_in_order_and_refills_finished_slots() -> None:
    clock = Clock(torch.device("cpu"))
    admitted: list[tuple[int, str]] = []
    finished: list[str] = []
    lengths = {"a": 2, "b": 0, "c": 1, "d": 1}

    def start(s: int, inputs: str, gen: torch.Generator | None) -> list[int]:
        admitted.append((s, inputs))
        return [lengths[inputs]]

    def result(state: list[int], timing: Timing):
        timing.stop(clock)
        return timing.result(clock, [], [], 0, {})

    stream = SlotStream(
        2,
        [(k, k, None) for k in "abcd"],
        clock,
        start,
        lambda st: st[0] == 0,
        result,
        lambda key, res: finished.append(key),
    )
    assert admitted == [(0, "a"), (1, "b"), (1, "c")] and finished == ["b"]  # "b" is complete at admission
    while stream.busy:
        for s, slot in enumerate(stream.slots):
            if slot is not None:
                slot.state[0] -= 1
                if slot.state[0] == 0:
                    stream.finish(s)
    assert finished == ["b", "c", "a", "d"] and admitted[3:] == [(1, "d")]
    assert stream.slots == [None, None]


def test_timing_spans_and_latency() -> None:
    clock = Clock(torch.device("cpu"))
    timing = Timing(clock.now(), (clock.mark(), clock.mark()))
    marks = [clock.mark() for _ in range(4)]
    timing.cycle(*marks)
    assert timing.drafts == [(marks[0], marks[1]), (marks[2], marks[3])] and timing.verifies == [(marks[1], marks[2])]
    timing.stop(clock)
    res = timing.result(clock, [1, 2], [], 3, {"x": 1}, target_forwards=7)
    assert res.latency_s == timing.latency > 0 and res.target_forwards == 7 and res.drafter_forwards == 3
    assert timing.result(clock, [], [], 0, {}).target_forwards == 1  # the prefill's, unless told


def test_decides_on_host() -> None:
    cpu = torch.device("cpu")
    assert decides_on_host("auto", cpu) and decides_on_host("host", cpu) and not decides_on_host("device", cpu)
