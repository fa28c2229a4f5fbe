"""Evaluation checked before decoding: each metric's packages and weight files (format, size, sha256 of known files)
fail at validation in one line naming the key; OpenAI's TorchScript CLIP files load; open_clip's pretrained tags
load from the local Hugging Face cache (a fake cache layout here)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_open_clip
from test_eval import clip_overrides, compose_cfg, make_run

from adtbench.errors import ConfigError
from adtbench.harness.eval import run_eval
from adtbench.harness.eval.metrics import validate
from adtbench.harness.eval.weights import check_weight_file, require_packages, weight_format

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------------
# weight files: format, size, truncation, sha256
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path):
    from safetensors.torch import save_file

    sd = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3)}
    out = {"zip": tmp_path / "model.pt", "legacy": tmp_path / "legacy.pt", "st": tmp_path / "model.safetensors"}
    torch.save(sd, out["zip"])
    torch.save(sd, out["legacy"], _use_new_zipfile_serialization=False)
    save_file(sd, str(out["st"]))
    out["empty"] = tmp_path / "empty.pt"
    out["empty"].write_bytes(b"")
    out["zip_cut"] = tmp_path / "cut.pt"
    out["zip_cut"].write_bytes(out["zip"].read_bytes()[:-100])
    out["st_cut"] = tmp_path / "cut.safetensors"
    out["st_cut"].write_bytes(out["st"].read_bytes()[:-8])
    out["html"] = tmp_path / "error_page.bin"
    out["html"].write_bytes(b"<html><body>403 Forbidden</body></html>")
    script = torch.jit.script(torch.nn.Linear(4, 3))
    out["jit"] = tmp_path / "scripted.pt"
    script.save(str(out["jit"]))
    return out


def test_weight_format_tells_each_format_and_refuses_broken_files(files):
    assert [weight_format(files[k]) for k in ("zip", "legacy", "st", "jit")] == [
        "torch-zip", "pickle", "safetensors", "torchscript",
    ]  # fmt: skip
    for k, why in (("empty", "empty (0 bytes)"), ("zip_cut", "truncated or corrupt zip"),
                   ("st_cut", "truncated safetensors"), ("html", "unknown header")):  # fmt: skip
        with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
            weight_format(files[k])


def test_check_weight_file_one_line_naming_the_key(files):
    for k in ("empty", "zip_cut", "st_cut", "html"):
        with pytest.raises(ConfigError) as e:
            check_weight_file(files[k], "eval.weights.inception", "weights-inception-2015-12-05-6726825d.pth")
        assert e.value.key == "eval.weights.inception" and "\n" not in str(e.value) and str(files[k]) in str(e.value)
    with pytest.raises(ConfigError) as e:  # a TorchScript archive where a state dict is loaded
        check_weight_file(files["jit"], "eval.aesthetic.predictor", "sac+logos+ava1-l14-linearMSE.pth")
    assert e.value.key == "eval.aesthetic.predictor" and "TorchScript" in str(e.value)
    assert check_weight_file(files["jit"], "eval.clip.pretrained", "x", formats=("torchscript",))[1] == "torchscript"


def test_known_sha256_is_checked(files, tmp_path):
    """A hash from ``eval.sha256`` (computed here from the file), and torch hub's name convention."""
    digest = hashlib.sha256(files["zip"].read_bytes()).hexdigest()
    assert check_weight_file(files["zip"], "k", "x", table={"model.pt": digest})[1] == "torch-zip"
    with pytest.raises(ConfigError) as e:
        check_weight_file(files["zip"], "eval.weights.vgg16", "x", table={"model.pt": "0" * 64})
    assert e.value.key == "eval.weights.vgg16" and "eval.sha256" in str(e.value) and digest[:16] in str(e.value)
    good = tmp_path / f"vgg16-{digest[:8]}.pth"
    good.write_bytes(files["zip"].read_bytes())
    check_weight_file(good, "eval.weights.vgg16", "x")
    bad = tmp_path / "weights-inception-2015-12-05-6726825d.pth"  # right name, other bytes
    bad.write_bytes(files["zip"].read_bytes())
    with pytest.raises(ConfigError) as e:
        check_weight_file(bad, "eval.weights.inception", "x")
    assert "torch hub" in str(e.value) and "6726825d" in str(e.value)
    # the hash is memoised in the cache dir when it exists
    cache = tmp_path / "cache"
    cache.mkdir()
    check_weight_file(good, "eval.weights.vgg16", "x", cache_dir=cache)
    assert digest in (cache / "hashes.json").read_text()


def test_openai_clip_file_checked_against_its_download_hash(files, tmp_path):
    """``ViT-L-14.pt``: open_clip's table carries the sha256 of OpenAI's file in its URL; another file fails."""
    pytest.importorskip("open_clip")
    fake = tmp_path / "ViT-L-14.pt"
    fake.write_bytes(files["jit"].read_bytes())
    with pytest.raises(ConfigError) as e:
        check_weight_file(fake, "eval.clip.pretrained", "x", formats=("torchscript",))
    assert "OpenAI" in str(e.value) and "b8cca3fd41ae0c99" in str(e.value)


def test_eval_sha256_from_the_config(files, tmp_path):
    run = make_run(tmp_path / "run")
    cfg = compose_cfg(
        "eval=aesthetic", f"eval.aesthetic.predictor={files['zip']}", "+eval.sha256={model.pt: " + "1" * 64 + "}"
    )
    with pytest.raises(ConfigError) as e:
        run_eval(cfg, run)
    assert e.value.key == "eval.aesthetic.predictor" and "sha256" in str(e.value)


# ----------------------------------------------------------------------------------------------------
# packages
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "module", "key"),
    [("clip", "open_clip", "eval.clip"), ("hps", "open_clip", "eval.hps"), ("fid", "torch_fidelity", "eval.fid"),
     ("prc", "torch_fidelity", "eval.prc"), ("kid", "torch_fidelity", "eval.kid")],
)  # fmt: skip
def test_missing_package_names_the_key_and_the_extra(monkeypatch, preset, module, key):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(f"eval={preset}"))
    assert e.value.key == key and "adtbench[metrics]" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError):
        require_packages(preset)
    monkeypatch.delitem(sys.modules, module)
    require_packages(preset)  # installed here


def _run_py(tmp_path: Path, *args: str, block: str | None = None) -> tuple[subprocess.CompletedProcess, float, float]:
    """``python run.py *args`` in a subprocess: (the process, its wall time, its CPU time: user + system)."""
    prelude = f"import sys; sys.modules[{block!r}] = None; " if block else "import sys; "
    code = prelude + "import runpy; sys.argv = ['run.py', *sys.argv[1:]]; runpy.run_path('run.py', run_name='__main__')"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0, cpu0 = time.perf_counter(), _children_cpu_s()
    proc = subprocess.run(
        [sys.executable, "-c", code, *args, f"hydra.run.dir={tmp_path / 'job'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc, time.perf_counter() - t0, _children_cpu_s() - cpu0


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished children: the work a subprocess did, which other
    processes on the machine (an xdist worker beside this one, other jobs) do not inflate as they do its wall time."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@pytest.mark.slow
@pytest.mark.parametrize("case", ["no open_clip", "empty file", "truncated file", "random TorchScript ViT-L-14.pt"])
def test_run_py_eval_clip_fails_before_decoding(tmp_path, files, case):
    """``python run.py eval=clip`` without open_clip, or with a bad weights file: exit 2, one line naming the key,
    before any model is loaded (no run dir) — the issue's goal is ≤ 10 s; measured ≈ 7–9 s on a loaded 2-core box."""
    vit = tmp_path / "ViT-L-14.pt"
    vit.write_bytes(files["jit"].read_bytes())
    args, block = {
        "no open_clip": (["eval=clip", f"eval.clip.pretrained={files['zip']}"], "open_clip"),
        "empty file": (["eval=clip", f"eval.clip.pretrained={files['empty']}"], None),
        "truncated file": (["eval=clip", f"eval.clip.pretrained={files['zip_cut']}"], None),
        "random TorchScript ViT-L-14.pt": (["eval=clip", f"eval.clip.pretrained={vit}"], None),
    }[case]
    proc, elapsed, cpu = _run_py(tmp_path, *args, block=block)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(err) == 1 and err[0].startswith("adtbench: config error: eval.clip"), proc.stderr
    assert not (tmp_path / "job").exists()  # refused by the command-line check: nothing decoded or written
    print(f"{case}: exit 2 in {elapsed:.1f} s wall, {cpu:.1f} s CPU (load {os.getloadavg()[0]:.1f}): {err[0][:160]}")
    # CPU time, not wall: on a shared or xdist-parallel box the wall time measures the neighbours (40 s wall and
    # 4 s CPU at load 10); the goal, ≤ 10 s, holds for the process's own work
    assert cpu < 10.0


# ----------------------------------------------------------------------------------------------------
# OpenAI's TorchScript files and open_clip tags from the local cache
# ----------------------------------------------------------------------------------------------------


class _Holder(torch.nn.Module):
    """A TorchScript container holding an open_clip model's parameters under its names (as OpenAI's jit files do)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        for k, v in model.named_children():
            self.add_module(k, v)
        for k, v in model.named_parameters(recurse=False):
            self.register_parameter(k, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.fixture(scope="module")
def tiny_quick(tmp_path_factory):
    """The tiny open_clip architecture of test_eval with QuickGELU, saved as a state dict, a TorchScript archive
    and a safetensors file."""
    pytest.importorskip("open_clip")
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("quick")
    model = tiny_open_clip(d, seed=1, quick_gelu=True)
    torch.jit.script(_Holder(model)).save(str(d / "tiny_clip.jit.pt"))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "open_clip_model.safetensors"))
    return {"dir": d, "json": d / "adtbench-tiny-clip.json", "weights": d / "tiny_clip.pt",
            "jit": d / "tiny_clip.jit.pt", "st": d / "open_clip_model.safetensors"}  # fmt: skip


def _clip_score(tmp_path: Path, t: dict, pretrained: str, *extra: str) -> float:
    run = make_run(tmp_path / "run") if not (tmp_path / "run").exists() else tmp_path / "run"
    over = [o for o in clip_overrides(t, tmp_path) if not o.startswith(("eval.clip.pretrained", "eval.clip.quick"))]
    cfg = compose_cfg("eval=clip", *over, f"eval.clip.pretrained={pretrained}", *extra)
    return float(run_eval(cfg, run).eval["clip_score"]["value"])


def test_torchscript_clip_file_loads_like_its_state_dict(tiny_quick, tmp_path):
    """OpenAI's released ``*.pt`` are TorchScript archives (``weights_only=True`` cannot read them): they load with
    ``torch.jit.load`` into the open_clip architecture and score exactly as the same weights as a state dict."""
    from_sd = _clip_score(tmp_path, tiny_quick, str(tiny_quick["weights"]), "eval.clip.quick_gelu=true")
    from_jit = _clip_score(tmp_path, tiny_quick, str(tiny_quick["jit"]), "eval.clip.quick_gelu=true")
    assert from_jit == pytest.approx(from_sd, abs=1e-5)
    plain = _clip_score(tmp_path, tiny_quick, str(tiny_quick["jit"]), "eval.clip.quick_gelu=false")
    assert plain != pytest.approx(from_sd, abs=1e-5)  # QuickGELU matters: the comparison can fail


def test_torchscript_of_another_architecture_is_one_line(tiny_quick, tmp_path):
    jit = tmp_path / "other.pt"
    torch.jit.script(torch.nn.Linear(3, 3)).save(str(jit))
    with pytest.raises(ConfigError) as e:
        _clip_score(tmp_path, tiny_quick, str(jit))
    assert e.value.key == "eval.clip.pretrained" and "does not match" in str(e.value) and "\n" not in str(e.value)


def _fake_hub_cache(root: Path, repo: str, filename: str, payload: bytes) -> Path:
    """The Hugging Face hub cache layout: models--org--name/{refs/main, snapshots/<commit>/<file>}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / filename).write_bytes(payload)
    return snap / filename


def test_open_clip_tag_from_the_local_hub_cache(tiny_quick, tmp_path, monkeypatch):
    """A pretrained tag resolves to its file in the local cache (never downloaded) and takes the tag's QuickGELU."""
    import open_clip.pretrained as pre

    monkeypatch.setitem(pre._PRETRAINED, "adtbench-tiny-clip", {"faketag": {"hf_hub": "adtbench/tiny-clip/",
                                                                             "quick_gelu": True}})  # fmt: skip
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hub"
    with pytest.raises(ConfigError) as e:  # not cached yet: one line naming the hub id
        _clip_score(tmp_path, tiny_quick, "faketag", f"eval.clip.cache_dir={cache}")
    assert e.value.key == "eval.clip.pretrained" and "adtbench/tiny-clip" in str(e.value)
    _fake_hub_cache(cache, "adtbench/tiny-clip", "open_clip_model.safetensors", tiny_quick["st"].read_bytes())
    from_tag = _clip_score(
        tmp_path, tiny_quick, "faketag", f"eval.clip.cache_dir={cache}", "eval.clip.quick_gelu=false"
    )
    from_file = _clip_score(tmp_path, tiny_quick, str(tiny_quick["weights"]), "eval.clip.quick_gelu=true")
    assert from_tag == pytest.approx(from_file, abs=1e-5)
    with pytest.raises(ConfigError) as e:
        _clip_score(tmp_path, tiny_quick, "nosuchtag", f"eval.clip.cache_dir={cache}")
    assert "faketag" in str(e.value)  # lists the architecture's tags
