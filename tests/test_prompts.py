"""Tests for adtbench.harness.data.prompts: loaders, id rules, limit/shard and config errors."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adtbench.errors import ConfigError
from adtbench.harness.data.prompts import (
    Prompt,
    load_prompts,
    parse_shard,
    shard_bounds,
    shard_prompts,
)

SHARED_DATA = Path(__file__).parents[1].parent / "shared" / "data"


# ---------------------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared prompt files (test-only); skip when the folder is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder absent: {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def parti_file(shared_data: Path) -> Path:
    p = shared_data / "PartiPrompts.tsv"
    if not p.is_file():
        pytest.skip(f"missing {p}")
    return p


@pytest.fixture(scope="session")
def coco_file(shared_data: Path) -> Path:
    p = shared_data / "captions_val2017.json"
    if not p.is_file():
        pytest.skip(f"missing {p}")
    return p


@pytest.fixture
def parti_tsv(tmp_path: Path) -> Path:
    p = tmp_path / "parti.tsv"
    p.write_text(
        "Prompt\tCategory\tChallenge\tNote\n"
        "bond\tAbstract\tBasic\tBiology-inspired\n"
        '"G I G G L E" on a wall\tIllustrations\tWriting & Symbols\t\n'
        "\n"  # blank line: skipped, not counted
        "  a cat  \tAnimals\tBasic\n"  # trailing Note column missing, whitespace stripped
        "a dog\tAnimals\tBasic\t\n",
        encoding="utf-8",
    )
    return p


@pytest.fixture
def coco_json(tmp_path: Path) -> Path:
    doc = {
        "images": [
            {"id": 30, "file_name": "000000000030.jpg"},
            {"id": 7, "file_name": "000000000007.jpg"},
            {"id": 99, "file_name": "000000000099.jpg"},  # no captions -> no prompt
            {"id": 12, "file_name": "000000000012.jpg"},
        ],
        "annotations": [
            # 60 is longest before stripping, ties with 50 after; file order is not id order
            {"id": 60, "image_id": 7, "caption": "caption number sixty  "},
            {"id": 41, "image_id": 7, "caption": "seven first"},
            {"id": 50, "image_id": 7, "caption": "caption number fifty"},
            {"id": 3, "image_id": 30, "caption": "thirty"},
            {"id": 2, "image_id": 12, "caption": "   "},  # empty after strip: ignored
            {"id": 9, "image_id": 12, "caption": "twelve\n"},
        ],
    }
    p = tmp_path / "captions.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.txt"
    p.write_text("# header comment\nfirst prompt\n\n   \n  # indented comment\n  second  \nthird", "utf-8")
    return p


# ---------------------------------------------------------------------------------------------------------
# real files
# ---------------------------------------------------------------------------------------------------------


def test_parti_real_file(parti_file: Path) -> None:
    ps = load_prompts("parti", str(parti_file), None, None)
    assert len(ps) == 1632
    assert ps[0] == Prompt("parti-0000", "bond", ps[0].meta)
    assert ps[0].meta["category"] == "Abstract" and ps[0].meta["challenge"] == "Basic"
    assert ps[-1].prompt_id == "parti-1631"
    assert len({p.prompt_id for p in ps}) == 1632
    # Quotes are kept literally (no CSV quote processing).
    assert any(p.text.startswith('"G I G G L E"') for p in ps)
    assert len({p.meta["category"] for p in ps}) == 12
    # -1 keeps all (ADT-Tree's prompts[:-1] dropped the last one).
    assert load_prompts("parti", parti_file, -1, None) == ps


def test_parti_real_ids_stable_under_limit_and_shard(parti_file: Path) -> None:
    full = load_prompts("parti", parti_file, None, None)
    sub = load_prompts("parti", parti_file, 100, "2/3")
    start, stop = shard_bounds(100, 2, 3)
    assert sub == full[start:stop]
    assert sub[0].prompt_id == f"parti-{start:04d}"
    union = [p for i in range(7) for p in load_prompts("parti", parti_file, None, f"{i}/7")]
    assert union == full


def test_coco_real_file(coco_file: Path) -> None:
    first = load_prompts("coco", coco_file, None, None)
    longest = load_prompts("coco", coco_file, None, None, caption="longest")
    assert len(first) == len(longest) == 5000
    image_ids = [p.meta["image_id"] for p in first]
    assert image_ids == sorted(image_ids)
    assert first[0].prompt_id == f"coco-{image_ids[0]}"
    assert [p.prompt_id for p in first] == [p.prompt_id for p in longest]
    assert all(p.meta["caption_rule"] == "first" for p in first)
    assert all(p.meta["file_name"] == f"{p.meta['image_id']:012d}.jpg" for p in first)
    assert all(len(b.text) >= len(a.text) for a, b in zip(first, longest))
    # Check the rules against the raw file.
    doc = json.loads(coco_file.read_text("utf-8"))
    anns: dict[int, list[dict]] = {}
    for a in doc["annotations"]:
        anns.setdefault(a["image_id"], []).append(a)
    for p in first[:200]:
        a = min(anns[p.meta["image_id"]], key=lambda a: a["id"])
        assert (p.meta["ann_id"], p.text) == (a["id"], a["caption"].strip())
    assert sum(p.meta["n_captions"] for p in first) == 25014


# ---------------------------------------------------------------------------------------------------------
# synthetic files: exact checks
# ---------------------------------------------------------------------------------------------------------


def test_parti_synthetic(parti_tsv: Path) -> None:
    ps = load_prompts("parti", parti_tsv, None, None)
    assert [(p.prompt_id, p.text) for p in ps] == [
        ("parti-0000", "bond"),
        ("parti-0001", '"G I G G L E" on a wall'),
        ("parti-0002", "a cat"),
        ("parti-0003", "a dog"),
    ]
    assert ps[2].meta == {"row": 2, "category": "Animals", "challenge": "Basic", "note": ""}
    assert ps[0].meta["note"] == "Biology-inspired"


def test_coco_caption_rules(coco_json: Path) -> None:
    first = load_prompts("coco", coco_json, None, None, caption="first")
    assert [(p.prompt_id, p.text, p.meta["ann_id"]) for p in first] == [
        ("coco-7", "seven first", 41),
        ("coco-12", "twelve", 9),
        ("coco-30", "thirty", 3),
    ]
    assert first[0].meta == {
        "image_id": 7,
        "ann_id": 41,
        "file_name": "000000000007.jpg",
        "caption_rule": "first",
        "n_captions": 3,
    }
    longest = load_prompts("coco", coco_json, None, None, caption="longest")
    # ann 50 and 60 both have 20 characters after stripping -> the lower ann id (50) wins.
    assert (longest[0].text, longest[0].meta["ann_id"]) == ("caption number fifty", 50)
    assert [p.text for p in longest[1:]] == ["twelve", "thirty"]
    assert longest[0].meta["caption_rule"] == "longest"


def test_coco_without_images_section(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"annotations": [{"id": 1, "image_id": 5, "caption": "x"}]}), "utf-8")
    (q,) = load_prompts("coco", p, None, None)
    assert q.prompt_id == "coco-5" and q.meta["file_name"] is None


def test_text_file(text_file: Path) -> None:
    ps = load_prompts("text", text_file, None, None)
    assert [(p.prompt_id, p.text) for p in ps] == [
        ("text-00002", "first prompt"),
        ("text-00006", "second"),
        ("text-00007", "third"),
    ]
    assert ps[0].meta == {"line": 2}


def test_text_file_bom_crlf(tmp_path: Path) -> None:
    p = tmp_path / "p.txt"
    p.write_bytes("\ufeffune pomme\r\nein Apfel \u2028 rot\r\n".encode())
    ps = load_prompts("text", p, None, None)
    assert [p.text for p in ps] == ["une pomme", "ein Apfel \u2028 rot"]


def test_inline() -> None:
    (p,) = load_prompts("inline", None, None, None, text="  a red cube ")
    assert p == Prompt("inline-0000", "a red cube", {})
    assert len({p, Prompt("inline-0000", "a red cube")}) == 1  # hashable despite the dict meta
    assert load_prompts("inline", None, None, "1/2", text="x") == []


def test_limit(text_file: Path, parti_tsv: Path) -> None:
    full = load_prompts("parti", parti_tsv, None, None)
    assert load_prompts("parti", parti_tsv, -1, None) == full  # -1 keeps the last prompt too
    assert load_prompts("parti", parti_tsv, 2, None) == full[:2]
    assert load_prompts("parti", parti_tsv, 100, None) == full
    # limit applies before shard
    assert load_prompts("parti", parti_tsv, 3, "1/2") == full[2:3]
    assert load_prompts("parti", parti_tsv, 3, "0/2") == full[0:2]


def test_empty_shard_is_fine(parti_tsv: Path) -> None:
    parts = [load_prompts("parti", parti_tsv, 2, f"{i}/5") for i in range(5)]
    assert [len(x) for x in parts] == [1, 1, 0, 0, 0]


# ---------------------------------------------------------------------------------------------------------
# errors: each names the key (and the path for file problems)
# ---------------------------------------------------------------------------------------------------------


def _raises(key: str, *args, contains: tuple[str, ...] = (), **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        load_prompts(*args, **kwargs)
    err = ei.value
    assert err.key == key
    assert str(err).startswith(f"{key}: ")
    for c in contains:
        assert c in str(err), (c, str(err))
    return err


def test_error_missing_path() -> None:
    _raises("dataset.path", "parti", None, None, None)
    _raises("dataset.path", "text", "", None, None)


def test_error_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.tsv"
    _raises("dataset.path", "parti", str(missing), None, None, contains=(str(missing),))
    _raises("dataset.path", "coco", tmp_path, None, None, contains=(str(tmp_path),))  # a directory


def test_error_bad_formats(tmp_path: Path, coco_json: Path) -> None:
    bad_header = tmp_path / "bad.tsv"
    bad_header.write_text("prompt\tcategory\nx\ty\n", "utf-8")
    _raises("dataset.path", "parti", bad_header, None, None, contains=(str(bad_header), "header"))

    extra_cols = tmp_path / "extra.tsv"
    extra_cols.write_text("Prompt\tCategory\tChallenge\tNote\na\tb\tc\td\te\n", "utf-8")
    _raises("dataset.path", "parti", extra_cols, None, None, contains=(str(extra_cols), "line 2"))

    no_ann = tmp_path / "noann.json"
    no_ann.write_text(json.dumps({"images": []}), "utf-8")
    _raises("dataset.path", "coco", no_ann, None, None, contains=(str(no_ann), "annotations"))

    not_json = tmp_path / "x.json"
    not_json.write_text("{nope", "utf-8")
    _raises("dataset.path", "coco", not_json, None, None, contains=(str(not_json), "JSON"))

    bad_ann = tmp_path / "badann.json"
    bad_ann.write_text(json.dumps({"annotations": [{"id": "1", "image_id": 1, "caption": "c"}]}), "utf-8")
    _raises("dataset.path", "coco", bad_ann, None, None, contains=(str(bad_ann), "annotations[0]"))

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1"))
    _raises("dataset.path", "text", latin1, None, None, contains=(str(latin1), "UTF-8"))

    # A TSV given as kind=coco is invalid JSON, and a JSON file given as kind=parti has a wrong header.
    tsv = tmp_path / "p.tsv"
    tsv.write_text("Prompt\tCategory\tChallenge\tNote\nx\ty\tz\t\n", "utf-8")
    _raises("dataset.path", "coco", tsv, None, None, contains=(str(tsv), "JSON"))
    _raises("dataset.path", "parti", coco_json, None, None, contains=(str(coco_json), "header"))
    # A JSON list (not an object) is not a COCO file.
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]", "utf-8")
    _raises("dataset.path", "coco", lst, None, None, contains=(str(lst), "annotations"))


def test_error_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("", "utf-8")
    for kind in ("parti", "coco", "text"):
        _raises("dataset.path", kind, empty, None, None, contains=(str(empty), "empty"))
    comments = tmp_path / "comments.txt"
    comments.write_text("# only\n\n#comments\n", "utf-8")
    _raises("dataset.path", "text", comments, None, None, contains=(str(comments), "no prompts"))
    header_only = tmp_path / "h.tsv"
    header_only.write_text("Prompt\tCategory\tChallenge\tNote\n", "utf-8")
    _raises("dataset.path", "parti", header_only, None, None, contains=(str(header_only),))
    no_captions = tmp_path / "nc.json"
    no_captions.write_text(json.dumps({"images": [{"id": 1}], "annotations": []}), "utf-8")
    _raises("dataset.path", "coco", no_captions, None, None, contains=(str(no_captions),))


@pytest.mark.parametrize("spec", ["3/2", "2/2", "a/b", "0/0", "-1/2", "1", "1/2/3", "", "1.0/2"])
def test_error_bad_shard(spec: str, tmp_path: Path) -> None:
    # Checked before the (missing) file is touched.
    _raises("dataset.shard", "parti", tmp_path / "missing.tsv", None, spec, contains=(repr(spec),))


@pytest.mark.parametrize("limit", [0, -2, -100, 1.5, "10", True])
def test_error_bad_limit(limit: object, tmp_path: Path) -> None:
    _raises("dataset.limit", "parti", tmp_path / "missing.tsv", limit, None)


def test_error_unknown_kind_caption_text(tmp_path: Path) -> None:
    _raises("dataset.kind", "imagenet", tmp_path / "x", None, None, contains=("imagenet",))
    _raises("dataset.caption", "coco", tmp_path / "x", None, None, caption="random", contains=("random",))
    _raises("dataset.text", "inline", None, None, None)
    _raises("dataset.text", "inline", None, None, None, text="   ")


def test_error_key_prefix(tmp_path: Path) -> None:
    _raises("eval_set.path", "parti", tmp_path / "x.tsv", None, None, key_prefix="eval_set")
    _raises("eval_set.shard", "parti", None, None, "5/1", key_prefix="eval_set")


def test_config_error_pickles() -> None:
    e = ConfigError("dataset.path", "boom")
    e2 = pickle.loads(pickle.dumps(e))
    assert isinstance(e2, ValueError) and e2.key == "dataset.path" and str(e2) == "dataset.path: boom"


# ---------------------------------------------------------------------------------------------------------
# shard properties
# ---------------------------------------------------------------------------------------------------------


def test_parse_shard() -> None:
    assert parse_shard(None) == (0, 1)
    assert parse_shard("0/1") == (0, 1)
    assert parse_shard(" 3 / 8 ") == (3, 8)
    with pytest.raises(ConfigError, match=r"^my\.shard: "):
        parse_shard("8/8", key="my.shard")
    with pytest.raises(ConfigError):
        parse_shard(3)  # type: ignore[arg-type]


@given(total=st.integers(0, 300), n=st.integers(1, 40))
def test_shards_partition(total: int, n: int) -> None:
    items = [Prompt(f"p{k}", str(k), {}) for k in range(total)]
    shards = [shard_prompts(items, i, n) for i in range(n)]
    # union (in order) is everything -> disjoint, contiguous, order kept
    assert [p for s in shards for p in s] == items
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger shards come first
    for i in range(n):
        assert parse_shard(f"{i}/{n}") == (i, n)


@given(total=st.integers(0, 200), n=st.integers(1, 20), limit=st.integers(1, 250))
def test_shard_bounds_consistent(total: int, n: int, limit: int) -> None:
    kept = min(total, limit)
    bounds = [shard_bounds(kept, i, n) for i in range(n)]
    assert bounds[0][0] == 0 and bounds[-1][1] == kept
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


def test_shard_prompts_rejects_bad_index() -> None:
    with pytest.raises(ValueError):
        shard_prompts([], 2, 2)
    with pytest.raises(ValueError):
        shard_prompts([], 0, 0)
