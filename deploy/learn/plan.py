"""What a learner round is given, from the learner's settings: the `RoundPlan` (knobs, the
label packs' groundings, how the agents sample)."""

from __future__ import annotations

from agents.packs import PackNotFound, get_pack
from agents.packs.base import Pack
from agents.policy_client import Generation
from deploy.learn.settings import LearnerSettings
from learner.labels import Grounding
from learner.policy.chat_format import ToolFormat, resolve_tool_format
from learner.rounds import RoundPlan
from learner.subrounds import Sampling


class LearnerConfigError(RuntimeError):
    """The settings contradict what is already in Redis or on disk; the message names the fix."""


def round_plan(s: LearnerSettings) -> RoundPlan:
    """What each round runs with: the settings' train and round models, where it writes, and
    the label packs' groundings (their agents' feedback becomes labels and verified sub-rounds)."""
    gated = s.gate_packs()
    try:
        packs = [
            get_pack(
                ref, tutoring_source=s.tutoring_source, tutoring_eval_size=s.tutoring_eval_size
            )
            for ref in (gated if s.label_packs is None else s.label_packs)
        ]
    except PackNotFound as exc:
        which = "ARLOOP_EVAL_PACKS" if s.label_packs is None else "ARLOOP_LABEL_PACKS"
        raise LearnerConfigError(f"{exc}; fix {which}") from exc
    temperature = s.serving_temperature()
    return RoundPlan(
        checkpoints_dir=s.data_dir / "checkpoints",
        model_cache=s.model_cache,
        upload_to=s.checkpoint_uri,
        train=s.train,
        round=s.round,
        actor=s.consumer,
        promote=not gated,  # with an eval gate, the release flow moves the aliases
        grounding=groundings(packs, resolve_tool_format(s.tool_format, s.base_model)),
        sampling=Sampling(temperature, s.policy_max_tokens or 512),
    )


def groundings(packs: list[Pack], tool_format: ToolFormat) -> dict[str, Grounding]:
    """Per agent of a pack that can read its answers: its readers, tools and step budget. A
    team's own agent (`Pack.run`, named by the pack) gets its readers alone: its tools are its
    own code's, so the labelled prompts of one that offers tools are not replayed (the logged
    prompt does not render without them) and train by their feedback and `restate`."""
    out = {}
    for pack in packs:
        if pack.answer_of is None:
            continue
        reference_from = pack.reference_from or pack.answer_of
        if pack.run is not None:
            out[pack.name] = Grounding(
                pack.answer_of, reference_from, tool_format=tool_format, restate=pack.restate
            )
            continue
        for agent in pack.agents:
            g = agent.generation or Generation()
            out[agent.name] = Grounding(
                pack.answer_of,
                reference_from,
                agent.tools,
                agent.max_steps,
                tool_format,
                max_tokens=g.max_tokens,
                stop=g.stop,
                include_stop=g.include_stop,
                frequency_penalty=g.frequency_penalty or 0.0,
                presence_penalty=g.presence_penalty or 0.0,
                restate=pack.restate,
                decision=agent.decision,
            )
    return out
