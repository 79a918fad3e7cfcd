"""`POST /tokenize`: a chat request checked as `/v1/chat/completions` checks it, nothing written.

vLLM's route and shape (`count`, `max_model_len`, `tokens`), so a client that checks its
prompts against vLLM checks them here alike; `max_tokens` (ours) is what each choice would be
granted. A request the real call would refuse (over the context, over the cap, a tool format
the chat template cannot write) gets the same 400 with the same message: the agent API asks
this at start, so a pack that cannot fit the served model is said before the first run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from deploy.policy_server.access import Caller
from deploy.policy_server.completions import ServerState, lease
from deploy.policy_server.openai_wire import ChatRequest
from deploy.policy_server.prepare import prepare, target_of


async def tokenize(req: ChatRequest, request: Request, key: Caller) -> dict[str, Any]:
    """The prompt's token ids as the model would read them, the context they must fit, and
    the tokens each choice would be granted; the chat call's 400 when it would be refused."""
    st: ServerState = request.app.state.policy
    policy = await lease(st, target_of(req.model, st.settings.served_name), key)
    try:
        ready = await asyncio.to_thread(prepare, req, policy.tokenizer, policy.context, st.settings)
    finally:
        st.versions.unpin(policy)
    return {
        "count": len(ready.prompt_ids),
        "max_model_len": policy.context,
        "tokens": ready.prompt_ids,
        "max_tokens": ready.params[0].max_tokens,
    }
