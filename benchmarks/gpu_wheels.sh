#!/usr/bin/env bash
# The wheels a GPU machine without adtbench's dependencies needs (one whose python3 already holds torch, numpy,
# pandas, safetensors, pillow, tqdm, pyyaml: the device machines of this workplace), downloaded here into .whl/
# (git-ignored through .git/info/exclude) for CPython 3.12 on x86-64 Linux:
#   hydra-core, omegaconf (and antlr4-python3-runtime, an sdist built into a pure-Python wheel), and
#   transformers < 5 with the tokenizers / huggingface_hub it accepts (a machine with transformers 5 has neither).
# On the machine:  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#                  PYTHONPATH=/tmp/site PY=python3 OUT=$OUT benchmarks/gpu.sh STAGE   (one stage per device call)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/python -m pip}
excl=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$excl")"
grep -qx '/.whl/' "$excl" 2>/dev/null || echo '/.whl/' >> "$excl"
mkdir -p .whl
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do plat+=(--platform "$p"); done
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d .whl \
    hydra-core==1.3.2 omegaconf==2.3.0 transformers==4.57.6 tokenizers==0.22.1 huggingface_hub==0.36.0
$PIP wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -la .whl
