"""The template probe: a GGUF that carries no chat template is served with one of the templates Blazar ships
(blazar/store/turn_formats.py), chosen on its first load by measuring which one the model ends its turn in.

The loaded engine gets each candidate's prompt for a handful of fixed user turns, raw on its /completion route (the
template the instance started with plays no part): greedy, at most MAX_TOKENS tokens, stopped at the candidate's own
markers. The template whose answers end with some text the most often wins; then the one whose answers end the most
often; then the one that spent fewer tokens; then the candidates' order (the architecture's own first). The choice and
every candidate's numbers are recorded (`model.template_probed`) for the file's sha256, so a model is probed once.
"""

from __future__ import annotations

import logging

from blazar.adapters.engines.client import EngineClient
from blazar.context import Blazar
from blazar.errors import EngineUnreachable, TemplateProbeFailed
from blazar.events.models import ModelTemplateProbed, TemplateTrial
from blazar.instances.live import Instance, ResolvedModel
from blazar.store.chat_templates import PROBED_SAMPLING
from blazar.store.turn_formats import TurnFormat

log = logging.getLogger("blazar.supervisor")

PROMPTS = ("Say hi.", "What is the capital of France?", "Hello!", "What is 2+2?", "Name a color.")
MAX_TOKENS = 16
_TIMEOUT_S = 120.0  # one short answer, on a loaded machine


async def measure(client: EngineClient, base_url: str, api_key: str | None, candidates: list[TurnFormat]
                  ) -> list[TemplateTrial]:
    """Each candidate's numbers over PROMPTS."""
    trials = []
    for fmt in candidates:
        ended = answered = tokens = 0
        for prompt in PROMPTS:
            text = fmt.render([{"role": "user", "content": prompt}])
            try:
                status, answer = await client.post_json(base_url, "/completion", {
                    **PROBED_SAMPLING, "prompt": text, "n_predict": MAX_TOKENS, "seed": 0, "cache_prompt": False,
                    "stop": list(fmt.stops)}, api_key=api_key, timeout_s=_TIMEOUT_S)
            except EngineUnreachable as e:
                raise TemplateProbeFailed(e.message) from None
            if status != 200 or not isinstance(answer, dict):
                raise TemplateProbeFailed(f"/completion answered {status}: {str(answer)[:200]}")
            stopped = answer.get("stop_type") in ("eos", "word")
            ended += stopped
            answered += stopped and bool(str(answer.get("content") or "").strip())
            tokens += int(answer.get("tokens_predicted") or 0)
        trials.append(TemplateTrial(template=fmt.name, ended=ended, answered=answered, tokens=tokens))
    return trials


def choose(trials: list[TemplateTrial]) -> str:
    """The winner (see the module's docstring); `trials` in the candidates' order."""
    ranked = sorted(enumerate(trials), key=lambda it: (-it[1].answered, -it[1].ended, it[1].tokens, it[0]))
    return ranked[0][1].template


async def probe_instance(app: Blazar, inst: Instance, model: ResolvedModel, candidates: list[TurnFormat]
                         ) -> str | None:
    """Measure on the healthy (not yet ready) instance `inst`, record the choice for the model's file and return it;
    None (logged, nothing recorded: the next load probes again) when the engine did not answer as it should."""
    client = EngineClient(max_connections=1)
    try:
        trials = await measure(client, inst.base_url, inst.api_key, candidates)
    except TemplateProbeFailed as e:
        log.warning("%s: its template probe failed (%s); served with the %s template until its next load",
                    model.name, e.message, candidates[0].name)
        return None
    finally:
        await client.aclose()
    chosen = choose(trials)
    await app.record(ModelTemplateProbed(name=model.name, sha256=model.sha256, engine_tag=inst.engine_tag,
                                         prompts=len(PROMPTS), max_tokens=MAX_TOKENS, trials=trials, chosen=chosen))
    log.info("%s: its template probe chose %s (%s)", model.name, chosen,
             ", ".join(f"{t.template} {t.answered}/{len(PROMPTS)} answered in {t.tokens} tokens" for t in trials))
    return chosen
