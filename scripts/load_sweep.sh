#!/usr/bin/env bash
# The load-client sweep of docs/performance.md ("A standard load client"), end to end: guidellm (PyPI) in its own venv
# (.venv-load: it pins torch, datasets, transformers apart from ours), `specserve up` with
# SmolLM2-135M, wait for /healthz, then one guidellm run per level of concurrent streams
# (LEVELS, default 1 2 4 8 16), each bounded by a request count (4 per stream, at least 8) and
# MAX_SECONDS, every request asking for exactly 64 tokens (ignore_eos) on a SpecBench dev prompt;
# then the server is stopped (SIGINT, then `ray stop --force`). Loopback only; the tokenizer is
# the local converted model's (no model hub). Writes $OUT (default out/load-sweep): each level's
# guidellm JSON, healthz.json, metrics.txt, machine.txt and table.md (TTFT, ITL, throughput, errors per level).
# Needs .venv from scripts/setup.sh. Takes ~10 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
GUIDELLM=guidellm==0.8.1
PORT=${PORT:-8000}
URL=http://127.0.0.1:$PORT
MODEL=smollm2-135m
LEVELS=${LEVELS:-1 2 4 8 16}
MAX_SECONDS=${MAX_SECONDS:-150}
OUTPUT_TOKENS=64
OUT=${OUT:-out/load-sweep}
PROMPTS=${PROMPTS:-../shared/bench/specbench_dev.jsonl}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# the client's venv: torch first as scripts/setup.sh does it (the CPU build where one is offered)
[ -x .venv-load/bin/python ] || "$PY" -m venv .venv-load
.venv-load/bin/python -c "import torch" 2>/dev/null ||
  .venv-load/bin/python -m pip install -q torch==2.13.0
.venv-load/bin/guidellm --version 2>/dev/null | grep -q "${GUIDELLM#*==}" ||
  .venv-load/bin/python -m pip install -q "$GUIDELLM"

MODEL_DIR=$(.venv/bin/specserve models pull "$MODEL" | tail -1)
# one row per prompt: the first turn, and the output length guidellm asks for (with ignore_eos)
.venv-load/bin/python - "$PROMPTS" "$OUT/prompts.jsonl" "$OUTPUT_TOKENS" <<'EOF'
import json, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(src) as f, open(dst, "w") as out:
    for line in f:
        row = {"prompt": json.loads(line)["turns"][0], "output_tokens_count": n}
        out.write(json.dumps(row) + "\n")
EOF

server_pid=
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -INT -- "-$server_pid" 2>/dev/null || true  # its process group: specserve and Ray
    for _ in $(seq 60); do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
  fi
  .venv/bin/ray stop --force >/dev/null 2>&1 || true
}
trap stop_server EXIT
if curl -sf "$URL/healthz" >/dev/null 2>&1; then
  echo "load_sweep: something already serves $URL; stop it first" >&2
  exit 1
fi
setsid .venv/bin/specserve up --host 127.0.0.1 --port "$PORT" >"$OUT/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  curl -sf "$URL/healthz" >"$OUT/healthz.json" 2>/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { tail -20 "$OUT/server.log" >&2; exit 1; }
  sleep 3
done
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
  echo "cores: $(nproc)"
  echo "avx512_bf16: $(grep -q avx512_bf16 /proc/cpuinfo && echo yes || echo no)"
  echo "client: $(.venv-load/bin/guidellm --version)"
} >"$OUT/machine.txt"
# two untimed requests first: the first forwards of a fresh replica are not the sweep's
for _ in 1 2; do
  curl -sf "$URL/v1/chat/completions" -H 'content-type: application/json' -d \
    "{\"model\":\"$MODEL\",\"max_tokens\":$OUTPUT_TOKENS,\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}" \
    >/dev/null
done
curl -sf "$URL/healthz" >"$OUT/healthz.json"  # after a request: "serving" names the dtype

for streams in $LEVELS; do
  count=$((streams * 4 > 8 ? streams * 4 : 8))
  echo "load_sweep: $streams stream(s), $count requests" >&2
  (cd "$OUT" && "$ROOT/.venv-load/bin/guidellm" run \
    --backend "kind=openai_http,target=$URL,model=$MODEL,timeout=120" \
    --profile "kind=concurrent,streams=$streams" \
    --constraint "kind=max_requests,count=$count" \
    --constraint "kind=max_duration,seconds=$MAX_SECONDS" \
    --data "kind=json_file,path=$OUT/prompts.jsonl" \
    --tokenizer "kind=huggingface_auto,model=$MODEL_DIR" \
    --output "kind=json,path=$OUT/c$streams.json" \
    --disable-progress >"$OUT/c$streams.log" 2>&1)
done

curl -sf "$URL/metrics" >"$OUT/metrics.txt"  # the server's own request counts
stop_server
.venv-load/bin/python - "$OUT" $LEVELS <<'EOF' | tee "$OUT/table.md"
import json, sys
out, levels = sys.argv[1], sys.argv[2:]
print("| streams | requests ok | errors | cut by the time bound | TTFT mean / p50 / p95 ms"
      " | ITL mean / p95 ms | output tok/s | req/s |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for level in levels:
    (b,) = json.load(open(f"{out}/c{level}.json"))["benchmarks"]
    m = b["metrics"]
    n = m["request_totals"]
    ttft = m["time_to_first_token_ms"]["successful"]
    itl = m["inter_token_latency_ms"]["successful"]
    ok = b["requests"]["successful"]
    tokens = sum(r["output_metrics"]["text_tokens"] or 0 for r in ok)
    seconds = b["duration"]
    print(f"| {level} | {n['successful']} | {n['errored']} | {n['incomplete']} | "
          f"{ttft['mean']:.0f} / {ttft['median']:.0f} / {ttft['percentiles']['p95']:.0f} | "
          f"{itl['mean']:.1f} / {itl['percentiles']['p95']:.1f} | {tokens / seconds:.1f} | "
          f"{n['successful'] / seconds:.2f} |")
EOF
