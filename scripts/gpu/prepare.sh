#!/usr/bin/env bash
# Run HERE before the GPU check: fetch the wheels the H200 image lacks into .whl/ and split the
# SmolLM2 GGUF into two halves under .model/ (each call may carry at most 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
grep -qx '/.model/' .git/info/exclude 2>/dev/null || echo '/.model/' >> .git/info/exclude
rm -rf .whl .model && mkdir -p .whl .model
pyver=3.12
for spec in gguf==0.19.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.7.0 \
            typing-inspection==0.4.2; do
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version $pyver \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$spec"
done
gguf=$(ls ~/.cache/specserve/downloads/smollm2-135m/*.gguf 2>/dev/null | head -1)
[ -n "$gguf" ] || { .venv/bin/specserve models pull smollm2-135m >/dev/null; \
  gguf=$(ls ~/.cache/specserve/downloads/smollm2-135m/*.gguf | head -1); }
split -n 2 -d "$gguf" .model/part-
ls -la .whl .model
