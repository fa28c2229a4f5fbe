"""The accelerator seam, and a simulated CUDA device that runs the GPU code paths on the CPU.

Every place adtbench asks "is this a CUDA device?", synchronises, marks time inside a decode, reads memory counters,
makes a random generator for the model's device or captures a CUDA graph goes through this module
(``is_cuda``, ``synchronize``, ``mark`` / ``elapsed_s``, ``generator``, ``capture``). On a real GPU these are the
CUDA calls. Under the simulated device they run on the CPU with CUDA's rules enforced, so that CI — which has no
GPU — executes the code a GPU runs and fails where a GPU would.

The simulated device is ``accel_sim`` (entered here: ``simulate``, ``activate_from_env``); CUDA graphs and their
stand-in are ``accel_graphs`` (``capture``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from adtbench import accel_graphs, accel_sim
from adtbench.accel_sim import Simulation

log = logging.getLogger("adtbench")

SIMULATE_ENV = "ADTBENCH_SIMULATE_DEVICE"

# ---------------------------------------------------------------------------------------------------------
# The seam: device questions, synchronisation, timing marks, generators, memory
# ---------------------------------------------------------------------------------------------------------


def simulation() -> Simulation | None:
    """The active simulated device, or None."""
    return accel_sim.active


def cuda_available() -> bool:
    """A CUDA device is there (real, or simulated)."""
    return accel_sim.active is not None or torch.cuda.is_available()


def resolve(name: str) -> torch.device:
    """``auto`` / ``cuda[:i]`` / ``cpu`` → a torch device: under the simulated device ``auto`` and ``cuda`` are
    ``accel_sim.SIM_DEVICE``; otherwise ``auto`` is ``cuda`` when one is available. Raises ``ValueError`` for a CUDA
    device that is not there (callers name their config key)."""
    if name == "auto":
        name = "cuda" if cuda_available() else "cpu"
    dev = torch.device(name) if name != "cuda" or accel_sim.active is None else accel_sim.SIM_DEVICE
    if dev.type == "cuda" and accel_sim.active is not None:
        return accel_sim.SIM_DEVICE
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name!r} requested but no CUDA device is available")
    return dev


def vmap(fn: Callable[..., Any], in_dims: tuple[int | None, ...]) -> Callable[..., Any]:
    """``torch.vmap(fn, in_dims)``: ``fn`` over the leading dimension of its mapped arguments, one set of kernels
    for all. On the simulated device the placement rules see through functorch's wrappers and the outputs live where
    the inputs do (``Simulation.vmapped``)."""
    mapped = torch.vmap(fn, in_dims=in_dims)
    sim = accel_sim.active
    if sim is None:
        return mapped

    def simulated(*args: Any) -> Any:
        out = sim.vmapped(mapped, args)
        accel_graphs.made(out)  # a stand-in graph's own outputs, not inputs it reads
        return out

    return simulated


def is_cuda(device: torch.device | str | None) -> bool:
    """Does work on ``device`` run as on a CUDA device (a real one, or the simulated one)?"""
    if device is None:
        return False
    dev = device if isinstance(device, torch.device) else torch.device(device)
    return dev.type == "cuda" or (accel_sim.active is not None and dev == accel_sim.SIM_DEVICE)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for the device (a no-op on the host; counted on the simulated device)."""
    if accel_sim.active is not None and (device is None or is_cuda(device)):
        accel_sim.active.counts["synchronize"] += 1
    elif (device is None or torch.device(device).type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def mark(device: torch.device) -> Any:
    """A timestamp inside device work that does not synchronise: a recorded CUDA event on a GPU, ``perf_counter``
    elsewhere (the simulated device included: its work is done when the call returns)."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def elapsed_s(a: Any, b: Any) -> float:
    """Seconds between two ``mark``s (CUDA events: once the device has passed both, e.g. after ``synchronize``)."""
    if isinstance(a, float):
        return float(b - a)
    return 1e-3 * float(a.elapsed_time(b))


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A seeded random generator for work on ``device`` (CUDA's own on a GPU; the simulated device's there, the
    host's on the CPU): sampling on the device must draw from a generator of that device."""
    return torch.Generator(device=device).manual_seed(int(seed))


def pinned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host buffer that ``copy_to_host`` fills without synchronising: page-locked memory when ``device`` is a GPU
    (a copy into pageable memory waits for the device), plain host memory elsewhere (the simulated device notes it as
    pinned, so its copies count as asynchronous)."""
    if device.type == "cuda":
        return torch.zeros(shape, dtype=dtype, pin_memory=True)
    out = torch.zeros(shape, dtype=dtype)
    accel_sim.PINNED[out] = True
    return out


def copy_to_host(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Enqueue ``dst.copy_(src)`` from the device into a ``pinned`` host buffer without waiting for it: read ``dst``
    only after a ``Fence`` recorded after this call has been waited on. Counted as ``async_copies`` on the simulated
    device (its work is done when the call returns)."""
    dst.copy_(src, non_blocking=True)


class Fence:
    """A point in the device's queue the host can wait for later: ``record()`` after enqueuing work (a CUDA event on a
    GPU; a no-op elsewhere, where the work is done when its call returns), ``wait()`` blocks until the device passed
    it. Waiting on a fence recorded one step earlier, while the next step is queued, leaves the device busy (the
    graphed Jacobi loop's one-step-late read). Counted as ``fence_waits`` on the simulated device."""

    def __init__(self, device: torch.device) -> None:
        self.event = torch.cuda.Event() if device.type == "cuda" else None

    def record(self) -> None:
        if self.event is not None:
            self.event.record()

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()
        elif accel_sim.active is not None:
            accel_sim.active.counts["fence_waits"] += 1


def device_name(device: torch.device) -> str:
    """What to print for the device: the GPU's name, or the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if is_cuda(device):
        return "simulated cuda (cpu)"
    return "cpu"


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak allocated device memory since ``reset_peak_memory`` (None where the device keeps no such count)."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def graphs_supported(device: torch.device) -> bool:
    """Does ``engine.compile`` run CUDA graphs (or their stand-in) on ``device``?"""
    return is_cuda(device)


@contextlib.contextmanager
def simulate() -> Iterator[Simulation]:
    """Run the block on the simulated CUDA device (module docstring)."""
    with Simulation() as sim:
        yield sim


def activate_from_env() -> Simulation | None:
    """Enter the simulated device for the rest of the process when ``ADTBENCH_SIMULATE_DEVICE=cuda`` (an entry
    point's first call); any other non-empty value is an error naming the variable."""
    value = os.environ.get(SIMULATE_ENV, "").strip()
    if not value:
        return None
    if value != "cuda":
        raise SystemExit(f"adtbench: {SIMULATE_ENV}={value!r}: the only simulated device is 'cuda'")
    sim = Simulation()
    sim.__enter__()
    log.info("simulated device: model.device=cuda runs on the CPU with CUDA's placement rules (%s)", SIMULATE_ENV)
    import atexit

    def report_at_exit() -> None:
        print(f"adtbench: simulated cuda: {sim.report()}", file=sys.stderr)

    sim.report_at_exit = report_at_exit  # a caller running the entry point in process unregisters it (tests)
    atexit.register(report_at_exit)
    return sim
