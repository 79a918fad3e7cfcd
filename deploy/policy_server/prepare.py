"""A chat request as the engine takes it: prompt token ids and one SamplingParams per choice,
with every bound checked (a 400 naming the parameter, never a silent clamp or a 500)."""

from __future__ import annotations

from typing import Any

from deploy.policy_server.constraints import constraint_factory
from deploy.policy_server.openai_wire import ChatRequest, OpenAIError, tool_format_of
from deploy.policy_server.settings import PolicyServerSettings
from learner.policy.chat_format import ChatFormatError, call_stop_pattern, prompt_token_ids
from learner.policy.generation.engine import SamplingParams
from learner.policy.registry import CHAMPION


def target_of(model: str, served: str) -> str:
    """The alias or version a model string names: `arloop` -> champion, `arloop@v3` -> v3."""
    name, _, which = model.partition("@")
    if name != served or (model.endswith("@") and not which):
        raise OpenAIError(
            404,
            f"model {model!r} does not exist; this server serves {served!r}, "
            f"'{served}@candidate' and '{served}@v<N>'",
            param="model",
            code="model_not_found",
        )
    return which or CHAMPION


class Prepared:
    """What `prepare` gives: prompt ids, each choice's sampling, and how to constrain a row."""

    def __init__(self, prompt_ids: list[int], params: list[SamplingParams], make_constraint):
        self.prompt_ids, self.params, self.make_constraint = prompt_ids, params, make_constraint


def prepare(
    req: ChatRequest, tokenizer: Any, context: int, settings: PolicyServerSettings
) -> Prepared:
    """Prompt token ids and one SamplingParams per sample, or a 400 naming the field.

    Blocking (tokenising a long prompt, compiling a grammar): call it off the event loop.
    """
    _check_combinations(req, settings)
    fmt = tool_format_of(settings)
    try:
        prompt_ids = prompt_token_ids(tokenizer, req.plain_messages(), req.plain_tools(), fmt)
    except ChatFormatError as exc:
        raise OpenAIError(400, str(exc), param=exc.param) from None
    except RecursionError:
        raise OpenAIError(
            400, "a message's tool_calls arguments nest too deeply to read", param="messages"
        ) from None
    room = context - len(prompt_ids)
    if room < 1:
        raise OpenAIError(
            400,
            f"the prompt is {len(prompt_ids)} tokens; this model's context is {context} tokens "
            "(prompt plus completion)",
            param="messages",
            code="context_length_exceeded",
        )
    max_tokens = _max_tokens(req, settings, room, len(prompt_ids), context)
    sampling = SamplingParams(
        temperature=req.temperature,
        top_p=req.top_p,
        max_tokens=max_tokens,
        stop=tuple(req.stop),
        include_stop=req.include_stop_str_in_output,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        logit_bias=_logit_bias(req, tokenizer),
        seed=req.seed,
        top_logprobs=req.top_logprobs or 0,
        stop_line=call_stop_pattern(req.plain_tools(), fmt),
    )
    make = constraint_factory(req, tokenizer, fmt)
    return Prepared(prompt_ids, [sampling] * req.n, make)


def _check_combinations(req: ChatRequest, settings: PolicyServerSettings) -> None:
    if req.top_logprobs and not req.logprobs:
        raise OpenAIError(400, "top_logprobs requires logprobs: true", param="top_logprobs")
    if req.n > settings.max_n:
        raise OpenAIError(
            400,
            f"n is {req.n}; this server samples at most {settings.max_n} choices per request",
            param="n",
        )
    if req.max_tokens and req.max_completion_tokens and req.max_tokens != req.max_completion_tokens:
        raise OpenAIError(
            400,
            "max_tokens and max_completion_tokens disagree: send one of them",
            param="max_completion_tokens",
        )


def _max_tokens(
    req: ChatRequest, settings: PolicyServerSettings, room: int, prompt: int, context: int
) -> int:
    """The per-choice budget: what was asked, within the cap, the context and the request's
    total; unset means as much as all three allow."""
    asked = req.max_completion_tokens or req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    if asked is None:
        return max(1, min(settings.max_tokens_cap, room, settings.max_request_tokens // req.n))
    if asked > settings.max_tokens_cap:
        if settings.clamp_max_tokens:
            asked = settings.max_tokens_cap
        else:
            raise OpenAIError(
                400,
                f"{param} is {asked}; this server writes at most {settings.max_tokens_cap} "
                "tokens a choice (ARLOOP_MAX_TOKENS_CAP)",
                param=param,
            )
    if asked > room:
        if settings.clamp_max_tokens:
            asked = room
        else:
            raise OpenAIError(
                400,
                f"this model's context is {context} tokens; the prompt is {prompt} and "
                f"{param} asks {asked} more: lower {param} to at most {room}",
                param=param,
                code="context_length_exceeded",
            )
    if asked * req.n > settings.max_request_tokens:
        raise OpenAIError(
            400,
            f"n x {param} is {req.n} x {asked} = {req.n * asked} tokens; this server writes at "
            f"most {settings.max_request_tokens} per request (ARLOOP_MAX_REQUEST_TOKENS)",
            param="n",
        )
    return asked


def _logit_bias(req: ChatRequest, tokenizer: Any) -> tuple[tuple[int, float], ...]:
    vocab = len(tokenizer)
    out = []
    for token, bias in (req.logit_bias or {}).items():
        if int(token) >= vocab:
            raise OpenAIError(
                400,
                f"logit_bias names token {token}; this model's vocabulary has {vocab} tokens",
                param="logit_bias",
            )
        out.append((int(token), float(bias)))
    return tuple(out)
