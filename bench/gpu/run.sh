#!/usr/bin/env bash
# Run the H200 benchmarks on a 2-GPU machine prepared with ../shared/gpu (setup-device.sh sourced).
#   bench/gpu/run.sh serving   # GPU 0: in-process vs inferq; GPU 1 at the same time: naive HF
#   bench/gpu/run.sh scaling   # inferq with 1 worker vs 2 workers (one per GPU); scaling-1b: 1B shapes
#   bench/gpu/run.sh peer-refs; bench/gpu/run.sh peer-inferq   # one H200, two calls: in-process +
#       vllm serve, then inferq (every level 3 times); then locally:
#       python -m bench.merge OUT.json refs-results.json inferq-results.json
#   bench/gpu/run.sh sessions   # bench.sessions on h200-sessions.json (plain vs cache-affine pull);
#       SESSIONS=h200-lora-mix bench/gpu/run.sh sessions 560 2w-prefix-1a 2w-prefix-16a: the adapter mix
#   bench/gpu/run.sh fleet h200-lora 560   # bench.fleet: plain vs cache-affine pull under vllm bench serve
#   bench/gpu/run.sh swap CONFIG CASES [SIDE]   # bench.swap on bench/configs/swap/CONFIG.json: cold,swap in
#       one call; bursts one side a call (SIDE one, then dedicated), then locally:
#       python -m bench.swap --merge h200-swap-*.json --out DIR
#   bench/gpu/run.sh classes h200-mistral7b-classes classes   # bench.classes, one fleet a call (then today, fifo, ...)
#   bench/gpu/run.sh config NAME TARGETS TAG   # bench/configs/NAME.json, those targets only
#   bench/gpu/run.sh table-7b-refs; bench/gpu/run.sh table-7b-inferq   # one H200, two calls of < 9 min:
#       in-process + vllm serve with 1 and 4 API servers, then inferq WS + SSE, every OpenAI target
#       driven by vllm bench serve (h200-mistral7b-table.json); table-1b-refs, table-1b-inferq: the
#       1B shapes (h200-llama1b-table.json); then locally, per shape:
#       python -m bench.merge OUT.json table-7b-refs-results.json table-7b-inferq-results.json
# Results (json, md, png) are copied to $OUT (default /tmp/bench-out). The copy of the tree on the
# GPU machine may carry stale git metadata: name the commit sent, BENCH_GIT_COMMIT=<sha> bench/gpu/run.sh ...
set -u
out=${OUT:-/tmp/bench-out}; mkdir -p "$out"
# wheels the kit lacks for vLLM's own server (its SageMaker routes import these), unpacked once
for whl in .gpu/extra/*.whl; do [ -f "$whl" ] && python3 -m zipfile -e "$whl" /tmp/site/; done
# Pillow (vllm bench serve's datasets import it) only where the machine has none of its own
python3 -c "import PIL" 2>/dev/null || for whl in .gpu/extra/if-missing/pillow*.whl; do
  [ -f "$whl" ] && python3 -m zipfile -e "$whl" /tmp/site/; done
# the project installs as inferq.*: from a checkout, a namespace folder of links stands in for it
mkdir -p /tmp/ns/inferq && for p in api worker shared cli; do ln -sfn "$PWD/$p" "/tmp/ns/inferq/$p"; done
export PYTHONPATH=$PWD:/tmp/ns${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -f /tmp/m7/tokenizer.json ] || python3 .gpu/b/make-model.py /tmp/m7 --preset mistral-7b >/tmp/make-model.log 2>&1 || cp /tmp/make-model.log "$out/"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
collect() {  # name dir
  for f in results.json; do
    [ -f "$2/$f" ] && gzip -c "$2/$f" > "$out/$1-$f.gz"
  done
  tail -n 40 "$2"/logs/*.log > "$out/$1-logs.txt" 2>/dev/null || true
}
# Llama-3.2-1B shapes (/tmp/m1) from the 7B model's tokenizer
[ -f /tmp/m1/config.json ] || { mkdir -p /tmp/m1 && cp /tmp/m7/* /tmp/m1/ && python3 - <<'PY'
import json; p = "/tmp/m1/config.json"; c = json.load(open(p))
c.update(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
         num_key_value_heads=8, head_dim=64, tie_word_embeddings=True)
json.dump(c, open(p, "w"), indent=1)
PY
}
case "${1:-serving}" in
  sessions)  # [TIMEOUT_S [STACK ...]] multi-turn sessions, Mistral-7B shape, 2 workers on one GPU (0.42 of its memory each)
    # SESSIONS=h200-lora-mix: the multi-adapter mix (16 random adapters of the 7B shape, written here)
    name=${SESSIONS:-h200-sessions}; tag=${3:+-$3}; only=(); [ $# -ge 3 ] && only=(--only "${@:3}")
    timeout "${2:-500}" python3 -m bench.sessions "bench/configs/sessions/$name.json" --out /tmp/b-sessions$tag \
      "${only[@]}" > /tmp/b-sessions.log 2>&1
    cp /tmp/b-sessions$tag/sessions.json "$out/$name$tag.json" 2>/dev/null
    tail -n 40 /tmp/b-sessions$tag/logs/*/*.log > "$out/sessions$tag-logs.txt" 2>/dev/null
    cp /tmp/b-sessions.log "$out/"; tail -n 20 /tmp/b-sessions.log ;;
  fleet)  # CONFIG [TIMEOUT_S [ARGS...]]: bench.fleet on bench/configs/fleet/CONFIG.json (one fleet, plain and
    # cache-affine pull switched at run time, driven by vllm bench serve); fleet.json is written after each case
    timeout "${3:-560}" python3 -m bench.fleet "bench/configs/fleet/$2.json" --out "/tmp/b-fleet-$2" "${@:4}" \
      > "/tmp/b-fleet-$2.log" 2>&1
    cp "/tmp/b-fleet-$2/fleet.json" "$out/fleet-$2.json" 2>/dev/null
    tail -n 25 /tmp/b-fleet-$2/logs/fleet/worker-fleet-0.log /tmp/b-fleet-$2/logs/fleet/gateway-fleet.log \
      /tmp/b-fleet-$2/logs/client-*.log > "$out/fleet-$2-logs.txt" 2>/dev/null
    cp "/tmp/b-fleet-$2.log" "$out/"; tail -n 30 "/tmp/b-fleet-$2.log" ;;
  swap)  # CONFIG CASES [SIDE [TIMEOUT_S]]: a multi-model worker (two 7B shapes, sleep mode): CASES, comma-separated
    # (cold,swap: the cold starts, then the swaps on the last worker started), or bursts on one SIDE (one: the
    # multi-model worker; dedicated: a worker per model), each side one call; swap.json is written after each case
    name="$2-${3//,/-}${4:+-$4}"; side=(); [ -n "${4:-}" ] && side=(--side "$4")
    timeout "${5:-560}" python3 -m bench.swap "bench/configs/swap/$2.json" --only ${3//,/ } "${side[@]}" \
      --out "/tmp/b-$name" > "/tmp/b-$name.log" 2>&1
    cp "/tmp/b-$name/swap.json" "$out/$name.json" 2>/dev/null
    tail -n 40 /tmp/b-$name/logs/*.log > "$out/$name-logs.txt" 2>/dev/null
    # where a start's time goes (vLLM's own lines) and every swap's steps
    grep -h -E "took|takes|finished in|Compil|compil|capturing|swapped|swap .* ->|Overriding|Initializing a V1|spawn" /tmp/b-$name/logs/*.log \
      > "$out/$name-steps.txt" 2>/dev/null
    cp "/tmp/b-$name.log" "$out/"; tail -n 30 "/tmp/b-$name.log" ;;
  classes)  # CONFIG STACK [TIMEOUT_S]: bench.classes on bench/configs/classes/CONFIG.json, one fleet (classes, today,
    # fifo, fair, tenants-fifo, tenants-queue); the results of every call add up in /tmp/b-classes (one machine)
    timeout "${4:-560}" python3 -m bench.classes "bench/configs/classes/$2.json" --only "$3" --out /tmp/b-classes \
      > "/tmp/b-classes-$3.log" 2>&1
    cp /tmp/b-classes/classes.json "$out/classes-$2.json" 2>/dev/null
    cp /tmp/b-classes/"$3"-runs.json "$out/classes-$2-$3-runs.json" 2>/dev/null
    tail -n 25 /tmp/b-classes/logs/"$3"/*.log > "$out/classes-$3-logs.txt" 2>/dev/null
    cp "/tmp/b-classes-$3.log" "$out/"; tail -n 30 "/tmp/b-classes-$3.log" ;;
  config)  # NAME TARGETS TAG [TIMEOUT_S]
    timeout "${5:-560}" python3 -m bench run --config "bench/configs/$2.json" --targets "$3" --out "/tmp/b-$4" \
      > "/tmp/b-$4.log" 2>&1
    collect "$4" "/tmp/b-$4"; cp "/tmp/b-$4.log" "$out/$4.log"; tail -n 30 "/tmp/b-$4.log" ;;
  serving)
    [ -n "${SKIP_NAIVE:-}" ] || timeout 540 python3 -m bench run --config bench/configs/h200-mistral7b-naive.json --out /tmp/b-naive \
      > /tmp/b-naive.log 2>&1 &
    naive=$!
    timeout 540 python3 -m bench run --config bench/configs/h200-mistral7b-serving.json --out /tmp/b-serving \
      > /tmp/b-serving.log 2>&1
    wait $naive
    collect serving /tmp/b-serving; collect naive /tmp/b-naive
    tail -n 30 /tmp/b-serving.log /tmp/b-naive.log ;;
  gw4)
    timeout 400 python3 -m bench run --config bench/configs/h200-mistral7b-gw4.json --out /tmp/b-gw4 > /tmp/b-gw4.log 2>&1
    collect gw4 /tmp/b-gw4; tail -n 14 /tmp/b-gw4.log ;;
  peer-refs|peer-inferq)
    which=${1#peer-}; targets=inprocess,vllm-serve; [ "$which" = inferq ] && targets=inferq-ws,inferq-sse
    timeout 580 python3 -m bench run --config bench/configs/h200-mistral7b-peer.json --targets $targets \
      --out /tmp/b-$which > /tmp/b-$which.log 2>&1
    collect $which /tmp/b-$which; tail -n 30 /tmp/b-$which.log ;;
  table-7b-refs|table-7b-inferq|table-1b-refs|table-1b-inferq)  # vllm bench serve on every OpenAI target
    cfg=h200-mistral7b-table; [ "${1:6:2}" = 1b ] && cfg=h200-llama1b-table
    targets=${TARGETS:-inprocess,vllm-serve,vllm-serve-4}; [ "${1##*-}" = inferq ] && targets=${TARGETS:-inferq-ws,inferq-sse}
    # cut at 540 s (TIMEOUT_S), so that the results so far (results.json is written after each server) come back
    timeout "${TIMEOUT_S:-540}" python3 -m bench run --config "bench/configs/$cfg.json" --targets $targets --out "/tmp/b-$1" \
      > "/tmp/b-$1.log" 2>&1
    collect "$1" "/tmp/b-$1"; cp "/tmp/b-$1.log" "$out/$1.log"; tail -n 30 "/tmp/b-$1.log" ;;
  highrate)  # then the worker alone on this host's CPU
    timeout 420 python3 -m bench run --config bench/configs/h200-llama1b-highrate.json --out /tmp/b-1b > /tmp/b-1b.log 2>&1
    timeout 120 python3 -m bench worker --jobs 64,256,1024 --tokens 256 --step-ms 5 --out "$out/worker-alone.json" > /tmp/b-w.log 2>&1
    collect highrate /tmp/b-1b; tail -n 24 /tmp/b-1b.log; tail -n 4 /tmp/b-w.log ;;
  scaling|scaling-1b)  # 1 worker vs 2 on a 2-GPU machine, 7B (scaling) or 1B shapes (scaling-1b)
    cfg=h200x2-mistral7b; [ "$1" = scaling-1b ] && cfg=h200x2-llama1b
    timeout 560 python3 -m bench run --config bench/configs/$cfg.json --out /tmp/b-$cfg > /tmp/b-$cfg.log 2>&1
    collect $cfg /tmp/b-$cfg; tail -n 30 /tmp/b-$cfg.log ;;
esac
