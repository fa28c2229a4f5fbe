"""Prompt datasets: PartiPrompts TSV, COCO captions JSON, plain text files and inline prompts.

Every prompt carries a stable ``prompt_id`` derived from the source file (never from its position after
``limit``/``shard``), so that generated images, per-prompt records and evaluation captions are paired by
id, not by position (the reference code's ``eval_fid_clip`` pairs sorted file names with captions by
position, which breaks under slicing and sampling; ``docs/algorithms.md`` §10 item 23).

ID rules
    ``parti``  -> ``parti-{r:04d}``, r = 0-based index of the data row in the file (header excluded,
               blank lines skipped and not counted).
    ``coco``   -> ``coco-{image_id}`` (one prompt per image that has at least one non-empty caption).
    ``text``   -> ``text-{l:05d}``, l = 1-based line number in the file (comment and blank lines count).
    ``inline`` -> ``inline-0000``.

Order of operations: load everything -> ``limit`` (first N) -> ``shard`` (contiguous block ``i`` of ``n``).
All argument checks (kind, caption rule, limit, shard, path) happen before any file is read, and every failure
is a :class:`~adtbench.errors.ConfigError` naming the config key (``dataset.path`` etc.) and, for file
problems, the path.

The package never refers to a fixed data location: the caller passes the path from the config.
"""

from __future__ import annotations

import json
import operator
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adtbench.errors import ConfigError

__all__ = [
    "CAPTION_RULES",
    "KINDS",
    "PARTI_HEADER",
    "Prompt",
    "load_dataset",
    "load_prompts",
    "parse_shard",
    "shard_bounds",
    "shard_prompts",
]

KINDS: tuple[str, ...] = ("parti", "coco", "text", "inline")
CAPTION_RULES: tuple[str, ...] = ("first", "longest")
PARTI_HEADER: tuple[str, ...] = ("Prompt", "Category", "Challenge", "Note")
_PARTI_HEADER_LINE = "\t".join(PARTI_HEADER)

_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Prompt:
    """One text prompt.

    Attributes:
        prompt_id: stable, unique id within its dataset (see module docstring for the rules).
        text: the prompt text, stripped of surrounding whitespace.
        meta: source metadata, e.g. ``{"category": ..., "challenge": ...}`` for Parti or
            ``{"image_id": ..., "ann_id": ..., "file_name": ..., "caption_rule": ...}`` for COCO.
    """

    prompt_id: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False)  # hash by (prompt_id, text) only


# ----------------------------------------------------------------------------------------------------
# limit / shard
# ----------------------------------------------------------------------------------------------------


def _check_limit(limit: Any, key: str) -> int | None:
    """Validate ``limit``: ``None``/``-1`` -> all prompts (None); ``N >= 1`` -> first N; else an error.

    Note: ``-1`` means *all*. (ADT-Tree's loader did ``prompts[:-1]`` and silently dropped the last prompt.)
    """
    if limit is None:
        return None
    if isinstance(limit, bool):
        raise ConfigError(key, f"must be an integer >= 1, or -1/null for all prompts; got {limit!r}")
    try:
        n = operator.index(limit)
    except TypeError:
        raise ConfigError(key, f"must be an integer >= 1, or -1/null for all prompts; got {limit!r}") from None
    if n == -1:
        return None
    if n < 1:
        raise ConfigError(key, f"must be an integer >= 1, or -1/null for all prompts; got {n}")
    return n


def parse_shard(spec: str | None, key: str = "dataset.shard") -> tuple[int, int]:
    """Parse a shard spec ``"i/n"`` (0-based shard ``i`` of ``n``, ``0 <= i < n``) into ``(i, n)``.

    ``None`` means the whole set, ``(0, 1)``. Whitespace around the numbers is allowed; signs, ``"0/0"``,
    ``"3/2"`` and non-numeric specs raise :class:`ConfigError` under ``key``.
    """
    if spec is None:
        return (0, 1)
    if not isinstance(spec, str):
        raise ConfigError(key, f"expected a string 'i/n' (e.g. '0/4'), got {spec!r}")
    m = _SHARD_RE.match(spec)
    if m is None:
        raise ConfigError(key, f"expected 'i/n' with integers 0 <= i < n (e.g. '0/4'), got {spec!r}")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1:
        raise ConfigError(key, f"shard count n must be >= 1, got {spec!r}")
    if i >= n:
        raise ConfigError(key, f"shard index i must satisfy 0 <= i < n, got {spec!r}")
    return (i, n)


def shard_bounds(total: int, i: int, n: int) -> tuple[int, int]:
    """Half-open bounds ``[start, stop)`` of contiguous shard ``i`` of ``n`` over ``total`` items.

    With ``q, r = divmod(total, n)``, shard ``i`` has size ``q + (i < r)`` and starts at ``i*q + min(i, r)``:
    the first ``r`` shards get one extra item, so sizes differ by at most 1, the shards are disjoint,
    appear in order, and their union is ``range(total)``.
    """
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"need 0 <= i < n and n >= 1, got i={i}, n={n}")
    q, r = divmod(total, n)
    start = i * q + min(i, r)
    return start, start + q + (1 if i < r else 0)


def shard_prompts(prompts: Sequence[Prompt], i: int, n: int) -> list[Prompt]:
    """Contiguous shard ``i`` of ``n`` of ``prompts`` (order kept); see :func:`shard_bounds`. May be empty."""
    start, stop = shard_bounds(len(prompts), i, n)
    return list(prompts[start:stop])


# ----------------------------------------------------------------------------------------------------
# file readers
# ----------------------------------------------------------------------------------------------------


def _resolve_path(path: Any, key: str, kind: str) -> Path:
    """Check that ``path`` is given and names an existing regular file; return it (user-expanded)."""
    if path is None or (isinstance(path, str) and not path.strip()):
        raise ConfigError(key, f"a prompt file path is required for kind={kind!r} (got {path!r})")
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(key, f"expected a file path string, got {path!r}")
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(key, f"prompt file not found: {str(path)!r} (resolved: {p.absolute()})")
    if not p.is_file():
        raise ConfigError(key, f"not a regular file: {str(path)!r} (resolved: {p.absolute()})")
    return p


def _read_text(p: Path, key: str) -> str:
    """Read a UTF-8 file (a BOM is ignored); unreadable, non-UTF-8 or empty files raise ConfigError."""
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(key, f"cannot read prompt file {str(p)!r}: {e}") from e
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(key, f"prompt file {str(p)!r} is not valid UTF-8: {e}") from e
    if not text.strip():
        raise ConfigError(key, f"prompt file {str(p)!r} is empty")
    return text


def _lines(text: str) -> list[str]:
    """Split on ``\\n`` only (prompts may contain other Unicode line breaks); drop a trailing ``\\r``."""
    return [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]


def _load_parti(p: Path, key: str) -> list[Prompt]:
    """PartiPrompts TSV: header ``Prompt<TAB>Category<TAB>Challenge<TAB>Note``, then one prompt per row.

    Fields are split on tabs with no quote processing, so quotes inside prompts are kept literally
    (e.g. ``"G I G G L E" painted ...``). A missing trailing ``Note`` column is allowed.
    """
    lines = _lines(_read_text(p, key))
    header = tuple(f.strip() for f in lines[0].split("\t"))
    if header != PARTI_HEADER:
        raise ConfigError(
            key,
            f"{str(p)!r} is not a PartiPrompts TSV: expected header {_PARTI_HEADER_LINE!r}, got {lines[0][:200]!r}",
        )
    prompts: list[Prompt] = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue  # blank lines (e.g. a trailing newline) are not rows
        fields = line.split("\t")
        if not 3 <= len(fields) <= 4:
            raise ConfigError(key, f"{str(p)!r} line {lineno}: expected 4 tab-separated fields, got {len(fields)}")
        fields += [""] * (4 - len(fields))
        text, category, challenge, note = (f.strip() for f in fields)
        if not text:
            raise ConfigError(key, f"{str(p)!r} line {lineno}: empty Prompt field")
        row = len(prompts)
        prompts.append(
            Prompt(
                prompt_id=f"parti-{row:04d}",
                text=text,
                meta={"row": row, "category": category, "challenge": challenge, "note": note},
            )
        )
    return prompts


def _load_coco(p: Path, key: str, rule: str) -> list[Prompt]:
    """COCO captions JSON (official format): one prompt per image, images by ascending image id.

    Caption rule per image (over its non-empty, stripped captions):
        ``first``   -> the caption with the lowest annotation id (in the official val2017 file this is also
                       the first caption in file order, i.e. pycocotools' ``imgToAnns[img_id][0]``);
        ``longest`` -> the caption with the most characters; ties -> lowest annotation id.
    Images with no caption are skipped. ``file_name`` comes from ``images`` when present, else ``None``.
    """
    try:
        doc = json.loads(_read_text(p, key))
    except json.JSONDecodeError as e:
        raise ConfigError(key, f"{str(p)!r} is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("annotations"), list):
        raise ConfigError(key, f"{str(p)!r} is not a COCO captions file: no 'annotations' list")

    file_names: dict[int, str | None] = {}
    images = doc.get("images", [])
    if not isinstance(images, list):
        raise ConfigError(key, f"{str(p)!r}: 'images' must be a list")
    for j, img in enumerate(images):
        if not isinstance(img, dict) or not _is_int(img.get("id")):
            raise ConfigError(key, f"{str(p)!r}: images[{j}] has no integer 'id'")
        file_names[img["id"]] = img.get("file_name")

    # image_id -> list of (ann_id, caption)
    by_image: dict[int, list[tuple[int, str]]] = {}
    for j, ann in enumerate(doc["annotations"]):
        if (
            not isinstance(ann, dict)
            or not _is_int(ann.get("id"))
            or not _is_int(ann.get("image_id"))
            or not isinstance(ann.get("caption"), str)
        ):
            raise ConfigError(
                key,
                f"{str(p)!r}: annotations[{j}] needs integer 'id', integer 'image_id' and string 'caption'",
            )
        cap = ann["caption"].strip()
        if cap:
            by_image.setdefault(ann["image_id"], []).append((ann["id"], cap))

    prompts: list[Prompt] = []
    for image_id in sorted(by_image):
        caps = by_image[image_id]
        if rule == "first":
            ann_id, cap = min(caps, key=lambda c: c[0])
        else:  # "longest": max length, then lowest ann id
            ann_id, cap = min(caps, key=lambda c: (-len(c[1]), c[0]))
        prompts.append(
            Prompt(
                prompt_id=f"coco-{image_id}",
                text=cap,
                meta={
                    "image_id": image_id,
                    "ann_id": ann_id,
                    "file_name": file_names.get(image_id),
                    "caption_rule": rule,
                    "n_captions": len(caps),
                },
            )
        )
    return prompts


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _load_text(p: Path, key: str) -> list[Prompt]:
    """Plain text: one prompt per line; blank lines and ``#`` lines (after whitespace) are skipped."""
    prompts: list[Prompt] = []
    for lineno, line in enumerate(_lines(_read_text(p, key)), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        prompts.append(Prompt(prompt_id=f"text-{lineno:05d}", text=s, meta={"line": lineno}))
    return prompts


# ----------------------------------------------------------------------------------------------------
# entry point
# ----------------------------------------------------------------------------------------------------


def load_prompts(
    kind: str,
    path: str | os.PathLike[str] | None,
    limit: int | None,
    shard: str | None,
    *,
    caption: str = "first",
    text: str | None = None,
    key_prefix: str = "dataset",
) -> list[Prompt]:
    """Load a prompt set, apply ``limit`` then ``shard``.

    Args:
        kind: ``"parti"`` (PartiPrompts TSV), ``"coco"`` (COCO captions JSON), ``"text"`` (one prompt per
            line) or ``"inline"`` (the single prompt ``text``; ``path`` is ignored).
        path: the prompt file (required unless ``kind="inline"``).
        limit: keep the first N prompts (in file order) before sharding; ``None`` or ``-1`` keeps all;
            ``0`` or ``< -1`` is an error.
        shard: ``"i/n"``: keep contiguous block ``i`` of ``n`` (see :func:`shard_bounds`); ``None`` = all.
            A shard may be empty (more shards than prompts); that is not an error.
        caption: COCO caption rule, ``"first"`` (lowest annotation id) or ``"longest"``.
        text: the prompt for ``kind="inline"``.
        key_prefix: config group used in error keys (``f"{key_prefix}.path"`` etc.).

    Returns:
        The prompts of this shard, in file order, with unique, stable ids.

    Raises:
        ConfigError: on any configuration or file problem (checked before any file is read where possible);
            also when the file yields no prompts at all.
    """
    # Cheap checks first, so a bad override fails before any file is opened.
    if kind not in KINDS:
        raise ConfigError(f"{key_prefix}.kind", f"unknown prompt dataset kind {kind!r}; expected one of {KINDS}")
    n_limit = _check_limit(limit, f"{key_prefix}.limit")
    shard_i, shard_n = parse_shard(shard, key=f"{key_prefix}.shard")
    if caption not in CAPTION_RULES:
        raise ConfigError(f"{key_prefix}.caption", f"unknown caption rule {caption!r}; expected one of {CAPTION_RULES}")

    path_key = f"{key_prefix}.path"
    if kind == "inline":
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{key_prefix}.text", f"kind='inline' needs a non-empty prompt text, got {text!r}")
        prompts = [Prompt(prompt_id="inline-0000", text=text.strip(), meta={})]
    else:
        p = _resolve_path(path, path_key, kind)
        if kind == "parti":
            prompts = _load_parti(p, path_key)
        elif kind == "coco":
            prompts = _load_coco(p, path_key, caption)
        else:
            prompts = _load_text(p, path_key)
        if not prompts:
            raise ConfigError(path_key, f"no prompts found in {str(p)!r} (kind={kind!r})")

    ids = [q.prompt_id for q in prompts]
    assert len(set(ids)) == len(ids), "prompt ids must be unique"

    if n_limit is not None:
        prompts = prompts[:n_limit]
    return shard_prompts(prompts, shard_i, shard_n)


def load_dataset(cfg: Any) -> list[Prompt]:
    """A job's prompts: :func:`load_prompts` of its config's ``dataset`` node (``kind``, ``path``, ``limit``,
    ``shard``, ``caption``, ``text``)."""
    d = cfg.dataset
    return load_prompts(
        str(d.kind),
        None if d.get("path") is None else str(d.path),
        d.get("limit"),
        d.get("shard"),
        caption=str(d.get("caption", "first")),
        text=None if d.get("text") is None else str(d.text),
    )
