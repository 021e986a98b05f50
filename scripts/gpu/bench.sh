#!/usr/bin/env bash
# Run ON THE DEVICE (second call): rebuild the GGUF from the parts kept under /root, install the
# carried wheels, then benchmark on CUDA (bf16) with the same contract as on CPU.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD SPECSERVE_CACHE=/root/specserve-cache PYTHONUNBUFFERED=1
cat /root/smol/part-* > /root/smol/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.log"
python3 -m specserve.cli bench --model /root/smol/SmolLM2-135M-Instruct.Q4_1.gguf --device cuda \
  --data shared-bench/specbench_dev.jsonl --per-task "${PER_TASK:-3}" --max-new-tokens 128 \
  --strategies ar,prompt_lookup,lookahead --baselines hf_ar,hf_pld \
  --out "$OUT/report-gpu.json" --plot "$OUT/report-gpu.png" 2>&1 | tee "$OUT/bench-gpu.log"
