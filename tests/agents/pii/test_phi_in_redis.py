"""No raw identifier from the PHI corpus reaches Redis by any path of the agent API.

Every patient message of `phi_corpus.jsonl` goes to the medical pack's triage agent over real
HTTP, with the production scrubber on; the scripted model repeats what it was shown (into its
`kb_search` query and its answer), so whatever the model saw would land in the trajectory,
the thread checkpoint and the Reflexion memory. Each message then comes back as a correction
(free text) in feedback. Afterwards each patient's trajectory, feedback, thread state (read
back through the checkpointer, which stores it encoded) and long-term memory are searched for
every identifier of that patient's message, as a whole word.
"""

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis.asyncio as aioredis

from agents.checkpoints import make_checkpointer
from agents.events import MEMORY_PREFIX, STREAM_FEEDBACK, STREAM_TRAJECTORIES, decode
from agents.packs import load_packs
from agents.pii import PhiScrubber
from tests.fakes.fixtures import PATIENT_S
from tests.fakes.scripted_llm import Reply

CORPUS = [json.loads(line) for line in (Path(__file__).parent / "phi_corpus.jsonl").open()]
PATIENTS = [r for r in CORPUS if r["identifiers"]]


def echo(request) -> Reply:
    """Search for the patient's own words, then repeat them: a model that leaks what it sees."""
    messages = request["messages"]
    said = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if messages[-1]["role"] == "user":
        return Reply(tool_calls=[("kb_search", json.dumps({"query": said}))])
    return Reply(
        content=f"You said: {said} This is general information, not medical advice."
        "\nTriage: see a doctor"
    )


NUMBERS = {
    "prompt_token_ids",
    "completion_token_ids",
    "logprobs",
    "latency_ms",
    "started_at",
    "finished_at",
    "created_at",
    "duration_ms",
}


def texts(value) -> list[str]:
    """Every string inside a decoded event or state (token ids, timings and logprobs left out)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() if k not in NUMBERS for t in [str(k), *texts(v)]]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in texts(v)]
    if hasattr(value, "content"):  # a LangChain message in the checkpoint
        return texts(value.content) + texts(getattr(value, "tool_calls", []))
    return [str(value)] if value is not None else []


async def what_redis_holds(url: str, stored: list[str]) -> list[str]:
    """Per patient (`stored`: their user ids as arloop stores them): trajectory, feedback,
    thread state (read back through the checkpointer) and long-term memory, as text."""
    client = aioredis.Redis.from_url(url, socket_timeout=PATIENT_S)
    users = len(stored)
    found: list[list[str]] = [[] for _ in range(users)]
    try:
        for stream in (STREAM_TRAJECTORIES, STREAM_FEEDBACK):
            for _, fields in await client.xrange(stream):
                event = decode(fields)
                found[stored.index(event.user_id)] += texts(event.model_dump(mode="json"))
        saver = make_checkpointer(client)
        for i in range(users):
            state = await saver.aget_tuple({"configurable": {"thread_id": f"th-phi-{i}"}})
            assert state is not None, f"thread th-phi-{i} has no checkpoint"
            found[i] += texts(state.checkpoint["channel_values"])
            async for key in client.scan_iter(match=f"{MEMORY_PREFIX}:{stored[i]}:*"):
                found[i] += [v.decode() for v in await client.lrange(key, 0, -1)]
        return ["\n".join(f) for f in found]
    finally:
        await client.aclose()


def test_no_raw_identifier_reaches_redis(start_api, llm, redis_client):
    llm.responder = echo
    api = start_api(specs=load_packs(["medical"]), scrubber=PhiScrubber().scrub)

    def visit(i: int) -> None:
        text = PATIENTS[i]["text"]
        reply = api.run(text, user=f"patient-{i}", agent="triage", thread_id=f"th-phi-{i}")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        fb = api.feedback(
            trajectory_id=body["trajectory_id"],
            user_id=f"patient-{i}",
            feedback_token=body["feedback_token"],
            kind="correction",
            text=text,
        )
        assert fb.status_code == 202, fb.text

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(visit, range(len(PATIENTS))))

    assert redis_client.xlen(STREAM_TRAJECTORIES) == len(PATIENTS)
    assert redis_client.xlen(STREAM_FEEDBACK) == len(PATIENTS)
    leaked = []
    stored = [api.stored(f"patient-{i}") for i in range(len(PATIENTS))]
    holds = asyncio.run(what_redis_holds(api.settings.redis_url, stored))
    for record, held in zip(PATIENTS, holds, strict=True):
        assert "[" in held and "kb_search" in held  # the run landed, scrubbed
        leaked += [
            (v, record["text"])
            for v in (x["value"] for x in record["identifiers"])
            if re.search(rf"(?<!\w){re.escape(v)}(?!\w)", held)
        ]
    values = sum(len(r["identifiers"]) for r in PATIENTS)
    print(f"\n{values} identifiers in {len(PATIENTS)} messages; leaked into Redis: {leaked}")
    assert leaked == []
