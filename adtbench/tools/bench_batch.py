"""``adtbench bench batch``: AR and speculative throughput against the batch size B, both sides in one process.

    adtbench bench batch [hydra overrides] [bench.sizes=[1,2,4,8,16,32]] [bench.prompts=32] [bench.repeats=1]
                         [bench.out=outputs/bench_batch] [bench.readme=FILE]

The models are built once from the composed config (default: the default run's — ``model=mini``, its trained
drafter, ``policy=static_sampled``, T = 1, CFG 3, 1 thread — on ``dataset=mini`` unless the overrides choose a
dataset). Every B decodes the same first ``bench.prompts`` prompts, each with its own seed
(``config.prompt_seed``), with the AR baseline and with the method:

- B = 1 is the unbatched path (``engine.decode_ar`` / ``engine.generate``, one prompt after another) and the
  reference the ``vs B = 1`` columns divide by; ``bench.sizes`` must hold it.
- B > 1 goes through ``harness.batched.BatchedDecoder`` with all the prompts as one window: AR in groups of B
  (``decode_ar_batch``), the method with continuous batching over B slots (``generate_batch``: a finished slot takes
  the next prompt at once).

Timed scope, per side and B: wall time from before the first prefill to after the last token (``records.Clock``:
CUDA-synchronised at both ends). Outside it: prompt text encoding, the generators' seeding, the ``BatchTarget``'s
allocation, and one untimed warm-up of both sides on the first min(B, prompts) prompts before each B's timed work.
Inside it, for the method at B > 1: ``generate_batch``'s batched drafter cache and per-slot policy copies. The two sides
alternate in order from size to size (ABBA: AR first at the 1st, 3rd, … size) and from repeat to repeat: each side
is timed ``bench.repeats`` times per B (default 1) and the median wall time is used (all of them in ``batch.json``).

Per B: images/s and tokens/s of both sides (``stats.throughput``: images / wall; tokens = committed + 1 per image),
τ and d̄ of the method (Σ over all prompts / Σ cycles), the throughput speedup (method / AR images/s at this B), each
side's images/s relative to its own B = 1, the share of prompts whose tokens equal B = 1's (batched logits equal the
single-prompt ones up to float rounding, so in float32 a sampled token may flip), the mean per-image latency (at
B > 1 a slot's latency includes the other slots' work), the peak device memory (CUDA), the 1-minute load average
before and after the timed work, and the device.

Writes into ``bench.out``: ``batch.json`` (every row and the environment), ``batch.md`` (the table) and
``batch.png`` (images/s vs B of both sides and the speedup vs B, log2 x-axes; drawn with PIL, written by
``io.save_png``, the figures also in the PNG's ``data`` text chunk). ``bench.readme=FILE`` writes the table between
the ``<!-- batch-table:start -->`` / ``<!-- batch-table:end -->`` markers of FILE (a "Batched throughput" section
with them is appended when FILE has none).

Errors (``ConfigError`` naming the key, exit 2): ``bench.sizes`` not a list of distinct positive integers holding 1,
or a B above ``bench.prompts`` (its slots would idle); ``bench.prompts`` not positive or above the dataset's
prompts; an unknown ``bench.*`` option; and what ``decode.batch_size > 1`` refuses in the app (a loop policy, a model
without a batched target, ``engine.compile=true``: reported against ``bench.sizes`` or their own key).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from adtbench.errors import ConfigError
from adtbench.io import atomic_write_json, atomic_write_text, save_png

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32)
DEFAULT_PROMPTS = 32
DEFAULT_OUT = "outputs/bench_batch"
MARKER = "batch-table"
START, END = f"<!-- {MARKER}:start -->", f"<!-- {MARKER}:end -->"
SECTION = "## Batched throughput"
USAGE = (
    "usage: adtbench bench batch [hydra overrides] [bench.sizes=[1,2,4,8,16,32]] [bench.prompts=32] "
    "[bench.out=DIR] [bench.readme=FILE]"
)


# ----------------------------------------------------------------------------------------------------
# options
# ----------------------------------------------------------------------------------------------------


def parse_sizes(value: str) -> list[int]:
    """``[1,2,4]`` (or ``1,2,4``) → ``[1, 2, 4]``: distinct positive integers holding 1, sorted."""
    items = [x.strip() for x in value.strip().strip("[]").split(",") if x.strip()]
    if not items:
        raise ConfigError("bench.sizes", "needs at least one batch size, e.g. bench.sizes=[1,2,4]")
    if not all(x.isdigit() and int(x) >= 1 for x in items):
        raise ConfigError("bench.sizes", f"batch sizes must be positive integers, got {value!r}")
    sizes = [int(x) for x in items]
    if len(set(sizes)) != len(sizes):
        raise ConfigError("bench.sizes", f"batch sizes must be distinct, got {value!r}")
    if 1 not in sizes:
        raise ConfigError("bench.sizes", f"must hold 1 (the unbatched reference of the vs-B=1 columns), got {value!r}")
    return sorted(sizes)


def parse(args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """(``bench.*`` options, the hydra overrides). Raises ``ConfigError`` naming a bad option."""
    opts: dict[str, Any] = {
        "sizes": list(DEFAULT_SIZES),
        "prompts": DEFAULT_PROMPTS,
        "out": DEFAULT_OUT,
        "readme": None,
        "repeats": 1,
    }
    rest: list[str] = []
    for a in args:
        key, sep, value = a.partition("=")
        if not (key.startswith("bench.") and sep):
            rest.append(a)
            continue
        name = key[len("bench.") :]
        if name not in opts:
            raise ConfigError(key, f"unknown option; known: {sorted(f'bench.{k}' for k in opts)}")
        if name == "sizes":
            opts["sizes"] = parse_sizes(value)
        elif name in ("prompts", "repeats"):
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(key, f"must be a positive integer, got {value!r}")
            opts[name] = int(value)
        else:
            if not value:
                raise ConfigError(key, "needs a path")
            opts[name] = value
    if max(opts["sizes"]) > opts["prompts"]:
        raise ConfigError(
            "bench.sizes",
            f"B = {max(opts['sizes'])} exceeds bench.prompts = {opts['prompts']}: its "
            "slots would idle; use bench.prompts ≥ the largest size",
        )
    return opts, rest


def compose(opts: dict[str, Any], rest: list[str]) -> Any:
    """The composed, path-resolved config: ``dataset=mini`` unless ``rest`` chooses one, and
    ``decode.batch_size`` = the largest size, so the app's checks of batched decoding apply."""
    from adtbench.harness.config import compose_config, refuse_reference_in_bench

    over = list(rest)
    if not any(a.split("=", 1)[0].lstrip("+~") == "dataset" for a in over):
        over.insert(0, "dataset=mini")
    over.append(f"decode.batch_size={max(opts['sizes'])}")
    cfg = compose_config("config", over)
    refuse_reference_in_bench(cfg, "batch")
    return cfg


# ----------------------------------------------------------------------------------------------------
# the measurement
# ----------------------------------------------------------------------------------------------------


def device_name(device: torch.device) -> str:
    """The device in words: the GPU's name, or the CPU's model, its cores and the torch threads."""
    from adtbench import accel

    if accel.is_cuda(device):
        return accel.device_name(device)
    from adtbench.harness.caches import _cpu_name
    from adtbench.resources import cpus_available

    return f"CPU: {_cpu_name()}, {cpus_available()} cores, {torch.get_num_threads()} thread(s)"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _same(results: Sequence[Any], reference: Sequence[list[int]] | None) -> float | None:
    """Share of prompts whose tokens equal the reference's (None without a reference)."""
    if reference is None:
        return None
    same = sum(bool(r.tokens == t) for r, t in zip(results, reference, strict=True))
    return same / max(1, len(results))


def measure(cfg: Any, opts: dict[str, Any]) -> dict[str, Any]:
    """Build the models once and time every size (module docstring); returns ``{"environment", "rows"}``."""
    from adtbench import accel
    from adtbench.algorithm.engine import decode_ar, generate
    from adtbench.algorithm.records import Clock
    from adtbench.harness.app import check_config
    from adtbench.harness.batched import BatchedDecoder
    from adtbench.harness.job import Job
    from adtbench.harness.stats import throughput
    from adtbench.resources import cpus_available, load_average

    try:
        checked, prompts = check_config(cfg)  # the app's checks; resolves cfg's paths in place
    except ConfigError as e:
        if e.key == "decode.batch_size":  # set from bench.sizes
            raise ConfigError("bench.sizes", e.message) from None
        raise
    if len(prompts) < opts["prompts"]:
        raise ConfigError("bench.prompts", f"the dataset has {len(prompts)} prompts, fewer than {opts['prompts']}")
    prompts = prompts[: opts["prompts"]]
    job = Job.build(cfg, checked)  # the app's assembly: clamped top-k, rule, compile before bind, acceptance
    target, drafter, policy, sp, rule, acceptance = job.target, job.models, job.policy, job.sp, job.rule, job.acceptance
    use_cfg, gen_device = job.use_cfg, job.gen_device  # draws where the model is
    clock = Clock(target.device)
    seeds = [job.seed_of(p) for p in prompts]
    inputs = [target.encode_prompt(p.text, cfg=use_cfg) for p in prompts]  # B = 1: encoded outside the timed scope
    device = device_name(target.device)

    def one_at_a_time(n: int, method: bool) -> tuple[list[Any], float]:
        """The first ``n`` prompts, unbatched, one after another; (results, wall seconds)."""
        gens = [accel.generator(gen_device, s) for s in seeds[:n]]
        t0 = clock.now()
        out = [
            generate(target, drafter, policy, x, sp, g, rule, acceptance) if method else decode_ar(target, x, sp, g)
            for x, g in zip(inputs[:n], gens, strict=True)
        ]
        return out, clock.now() - t0

    rows: list[dict[str, Any]] = []
    reference: dict[str, list[list[int]]] = {}
    t_start = time.strftime("%Y-%m-%d %H:%M")
    for i, B in enumerate(opts["sizes"]):
        ar_first = i % 2 == 0  # ABBA across sizes (BatchedDecoder.window: baseline first on an even index)
        print(f"bench batch: B = {B} ({'AR' if ar_first else 'method'} first)", file=sys.stderr, flush=True)
        accel.reset_peak_memory(target.device)
        walls: dict[bool, list[float]] = {False: [], True: []}  # per side (method?), one per repeat
        if B == 1:
            for method in (False, True):  # warm-up, untimed
                one_at_a_time(1, method)
            load_before = load_average()
            for rep in range(opts["repeats"]):
                order = [False, True] if (ar_first == (rep % 2 == 0)) else [True, False]
                timed = {method: one_at_a_time(len(prompts), method) for method in order}
                walls[False].append(timed[False][1])
                walls[True].append(timed[True][1])
                if rep == 0:
                    base, runs = timed[False][0], timed[True][0]
            load_after = load_average()
        else:
            decoder = BatchedDecoder(
                target, drafter, policy, sp, rule, acceptance, B, use_cfg, gen_device, job.seed_of, True
            )
            decoder.window(prompts[:B], i)  # warm-up, untimed
            load_before = load_average()
            for rep in range(opts["repeats"]):
                decoded = decoder.window(prompts, i + rep)  # the window's parity sets the sides' order
                walls[True].append(decoded[0][4]["window_s"])
                walls[False].append(decoded[0][4]["baseline_window_s"])
                if rep == 0:
                    runs, base = [d[2] for d in decoded], [d[3] for d in decoded]
            load_after = load_average()
            del decoder, decoded  # the batch's KV cache goes before the next size allocates its own
        run_s, base_s = statistics.median(walls[True]), statistics.median(walls[False])
        window = {"window": f"B{B}", "window_s": run_s, "baseline_window_s": base_s}
        tp = throughput([{"committed": r.committed, "batch": window} for r in runs])
        cycles = sum(len(r.cycles) for r in runs)
        if B == 1:
            reference = {"ar": [r.tokens for r in base], "method": [r.tokens for r in runs]}
        rows.append(
            {
                "B": B,
                "first": "ar" if ar_first else "method",
                "ar_wall_s": base_s,
                "method_wall_s": run_s,
                "ar_wall_repeats_s": walls[False],
                "method_wall_repeats_s": walls[True],
                "ar_images_per_s": tp["baseline_throughput_images_per_s"],
                "method_images_per_s": tp["throughput_images_per_s"],
                "ar_tokens_per_s": tp["baseline_throughput_tokens_per_s"],
                "method_tokens_per_s": tp["throughput_tokens_per_s"],
                "tau": sum(r.committed for r in runs) / max(1, cycles),
                "d_bar": sum(c.drafted_depth for r in runs for c in r.cycles) / max(1, cycles),
                "speedup": tp["throughput_speedup"],
                "ar_latency_s": sum(r.latency_s for r in base) / len(base),
                "method_latency_s": sum(r.latency_s for r in runs) / len(runs),
                "ar_same_tokens_as_b1": _same(base, reference.get("ar")),
                "method_same_tokens_as_b1": _same(runs, reference.get("method")),
                "peak_memory_gib": accel.peak_memory_gib(target.device),
                "load_before": None if load_before is None else load_before[0],
                "load_after": None if load_after is None else load_after[0],
                "device": device,
            }
        )
    b1 = rows[0]  # sizes are sorted and hold 1
    for r in rows:
        r["ar_vs_b1"] = _ratio(r["ar_images_per_s"], b1["ar_images_per_s"])
        r["method_vs_b1"] = _ratio(r["method_images_per_s"], b1["method_images_per_s"])
    dataset = job.conf.dataset
    assert dataset is not None, "check_config loaded the dataset"
    env = {
        "model": str(cfg.model.name),
        "policy": policy.name + (" (sampled drafts)" if cfg.policy.get("draft_sampling") == "sample" else ""),
        "lantern": job.conf.lantern is not None and job.conf.lantern.enabled,
        "dataset": Path(str(dataset.path or dataset.kind)).name,
        "prompts": len(prompts),
        "sizes": list(opts["sizes"]),
        "tokens_per_image": int(target.layout.num_gen_tokens),
        "temperature": sp.temperature,
        "cfg_scale": sp.cfg_scale if use_cfg else 1.0,
        "device": device,
        "dtype": str(target.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpus_available": cpus_available(),
        "torch": torch.__version__,
        "acceptance": acceptance,
        "measured": t_start,
        "repeats": opts["repeats"],
    }
    return {"environment": env, "rows": rows}


# ----------------------------------------------------------------------------------------------------
# outputs
# ----------------------------------------------------------------------------------------------------


def _num(v: float | None, fmt: str, unit: str = "") -> str:
    return "–" if v is None else f"{v:{fmt}}{unit}"


def header(r: dict[str, Any], overrides: Sequence[str] = ()) -> str:
    """One line naming the machine, the setting, the protocol and the date."""
    e = r["environment"]
    over = f", overrides: `{' '.join(overrides)}`" if overrides else ""
    n = int(e.get("repeats", 1))
    times = "once" if n == 1 else f"{n} times"
    return (
        f"**{e['device']}**, torch {e['torch']}, {e['dtype']}; model={e['model']}, policy={e['policy']}"
        f"{', LANTERN' if e['lantern'] else ''}, T = {e['temperature']:g}, CFG {e['cfg_scale']:g}{over}; "
        f"the same {e['prompts']} prompts ({e['tokens_per_image']} tokens each) at every B, each side timed "
        f"{times} per B after one warm-up (median wall time), the sides' order alternating between sizes and repeats; "
        f"measured {e['measured']}."
    )


def table(r: dict[str, Any], overrides: Sequence[str] = ()) -> str:
    """The Markdown table of a :func:`measure` result, with its header and a line on reading it."""
    lines = [
        header(r, overrides),
        "",
        "| B | AR img/s | method img/s | AR tok/s | method tok/s | τ | d̄ | speedup (method / AR) | AR vs B = 1 | "
        "method vs B = 1 | load |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for x in r["rows"]:
        load = "/".join(_num(x[k], ".1f") for k in ("load_before", "load_after"))
        lines.append(
            f"| {x['B']} | {_num(x['ar_images_per_s'], '.3f')} | {_num(x['method_images_per_s'], '.3f')} | "
            f"{_num(x['ar_tokens_per_s'], '.0f')} | {_num(x['method_tokens_per_s'], '.0f')} | {x['tau']:.2f} | "
            f"{x['d_bar']:.2f} | {_num(x['speedup'], '.2f', '×')} | {_num(x['ar_vs_b1'], '.2f', '×')} | "
            f"{_num(x['method_vs_b1'], '.2f', '×')} | {load} |"
        )
    lines += [
        "",
        "img/s, tok/s: images (tokens) over the side's wall time, first prefill to last token. speedup: method / AR "
        "images/s at the same B. vs B = 1: a side's images/s over its own unbatched (B = 1) images/s. load: 1-min "
        "load average before/after the timed work.",
    ]
    return "\n".join(lines)


def write_readme(path: Path, text: str) -> None:
    """``text`` between the file's ``batch-table`` markers, or a new "Batched throughput" section holding them
    appended to the file."""
    from adtbench.reporting.tables import write_between_markers

    if not path.is_file():
        raise ConfigError("bench.readme", f"{path}: no such file")
    content = path.read_text()
    if START not in content and END not in content:
        atomic_write_text(path, content.rstrip("\n") + f"\n\n{SECTION}\n\n{START}\n{END}\n")
    try:
        write_between_markers(path, MARKER, text)
    except ValueError as e:
        raise ConfigError("bench.readme", f"{path}: {e}") from None


# --- the plot (PIL; the project's one PNG writer, io.save_png) --------------------------------------------------------

AR_RGB, METHOD_RGB, GRID_RGB, INK = (31, 119, 180), (255, 127, 14), (225, 225, 225), (20, 20, 20)


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # a scalable font (Pillow ≥ 10.1 with FreeType)
    except (TypeError, OSError):
        return ImageFont.load_default()


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]`` (steps 1, 2, 2.5 or 5 × 10^k), ascending."""
    if not hi > lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    t = first
    while t < hi + step * 0.999:
        ticks.append(round(t, 10))
        t += step
    return ticks


def _panel(
    img: Any,
    box: tuple[int, int, int, int],
    sizes: Sequence[int],
    series: Sequence[tuple[str, Sequence[float | None], tuple[int, int, int]]],
    title: str,
    ylabel: str,
    ref: float | None = None,
) -> None:
    """One line chart in ``box`` (left, top, right, bottom of the plot area): x = log2 B with a tick per size, y linear
    over the series' range (from 0, or around ``ref`` when given: a dashed reference line there). Labels are ASCII:
    the default font may lack "×" and "—"."""
    from PIL import Image, ImageDraw

    draw = ImageDraw.Draw(img)
    left, top, right, bottom = box
    font, small = _font(15), _font(13)
    values = [v for _, ys, _ in series for v in ys if v is not None]
    lo = 0.0 if ref is None else min([ref, *values])
    hi = max([*values, lo + 1e-9] if ref is None else [ref, *values])
    if ref is not None:
        pad = 0.08 * (hi - lo or 1.0)
        lo, hi = lo - pad, hi + pad
    ticks = nice_ticks(lo, hi)
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
    xs = [math.log2(b) for b in sizes]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    span = x1 - x0

    def px(x: float) -> float:
        return left + 20 + (right - left - 40) * (x - x0) / span

    def py(y: float) -> float:
        return bottom - (bottom - top) * (y - lo) / (hi - lo)

    for t in ticks:
        y = py(t)
        draw.line([(left, y), (right, y)], fill=GRID_RGB)
        draw.text((left - 8, y), f"{t:g}", fill=INK, font=small, anchor="rm")
    for b, x in zip(sizes, xs, strict=True):
        draw.line([(px(x), bottom), (px(x), bottom + 5)], fill=INK)
        draw.text((px(x), bottom + 8), str(b), fill=INK, font=small, anchor="mt")
    draw.rectangle([left, top, right, bottom], outline=INK)
    if ref is not None:
        y = py(ref)
        for xa in range(left, right, 12):
            draw.line([(xa, y), (min(xa + 6, right), y)], fill=(90, 90, 90), width=2)
    for _, ys, rgb in series:
        pts = [(px(x), py(y)) for x, y in zip(xs, ys, strict=True) if y is not None]
        if len(pts) > 1:
            draw.line(pts, fill=rgb, width=3)
        for x, y in pts:
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=rgb)
    draw.text(((left + right) / 2, top - 10), title, fill=INK, font=font, anchor="md")
    draw.text(((left + right) / 2, bottom + 30), "batch size B (log2 scale)", fill=INK, font=small, anchor="mt")
    w = int(draw.textlength(ylabel, font=small)) + 4
    label = Image.new("RGB", (w, 18), "white")
    ImageDraw.Draw(label).text((2, 9), ylabel, fill=INK, font=small, anchor="lm")
    label = label.rotate(90, expand=True)  # read bottom to top, left of the tick labels
    img.paste(label, (left - 62, int((top + bottom - w) / 2)))
    if len(series) > 1:  # legend, top left inside the axes
        for k, (name, _, rgb) in enumerate(series):
            y = top + 14 + 20 * k
            draw.line([(left + 12, y), (left + 36, y)], fill=rgb, width=3)
            draw.text((left + 42, y), name, fill=INK, font=small, anchor="lm")


def plot(r: dict[str, Any], path: Path) -> Path:
    """``batch.png``: images/s vs B of AR and the method (left) and the speedup method / AR vs B (right); the
    rows' figures also go into the PNG's ``data`` text chunk (JSON)."""
    from PIL import Image, ImageDraw

    e, rows = r["environment"], r["rows"]
    sizes = [x["B"] for x in rows]
    img = Image.new("RGB", (1100, 470), "white")
    draw = ImageDraw.Draw(img)
    draw.text(
        (550, 14),
        f"{e['model']}, policy={e['policy']}, {e['prompts']} prompts; {e['device']}",
        fill=INK,
        font=_font(16),
        anchor="mt",
    )
    _panel(
        img,
        (100, 70, 520, 390),
        sizes,
        [
            ("AR", [x["ar_images_per_s"] for x in rows], AR_RGB),
            (f"method: {e['policy']}", [x["method_images_per_s"] for x in rows], METHOD_RGB),
        ],
        "throughput",
        "images/s",
    )
    _panel(
        img,
        (660, 70, 1080, 390),
        sizes,
        [("speedup", [x["speedup"] for x in rows], METHOD_RGB)],
        "speedup at equal B (method / AR)",
        "speedup (x)",
        ref=1.0,
    )
    data = [{k: x[k] for k in ("B", "ar_images_per_s", "method_images_per_s", "speedup")} for x in rows]
    return save_png(img, path, {"data": json.dumps(data)})


# ----------------------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------------------


def run(args: list[str]) -> tuple[dict[str, Any], str]:
    """Parse, compose, measure, write the outputs (and ``bench.readme``); returns (result, table)."""
    opts, rest = parse(args)
    cfg = compose(opts, rest)
    if opts["readme"] and not Path(opts["readme"]).is_file():  # before any decoding
        raise ConfigError("bench.readme", f"{opts['readme']}: no such file")
    r = measure(cfg, opts)
    r["overrides"] = rest
    text = table(r, rest)
    out = Path(opts["out"])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "batch.json", r, newline=False)
    atomic_write_text(out / "batch.md", text + "\n")
    plot(r, out / "batch.png")
    if opts["readme"]:
        write_readme(Path(opts["readme"]), text)
    return r, text


def main(args: list[str]) -> int:
    try:
        _, text = run(args)
    except ConfigError as e:
        print(f"adtbench: config error: {e}\n{USAGE}", file=sys.stderr)
        return 2
    print(text)
    return 0
