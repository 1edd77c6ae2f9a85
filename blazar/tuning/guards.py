"""The guards a candidate posture must pass before `blazar tune` (blazar/tuning/tune.py) may adopt it.

A lossless change (speculation, threads, batch sizes, slots) must leave greedy output token-identical to the
defaults': speculative decoding only verifies drafted tokens, and the others only reorder the same arithmetic.
A KV-cache type (or flash attention switched) changes the numbers attention sees: its guard is measured along the
defaults' own greedy continuation (teacher-forced, one position at a time): the candidate's top-1 must agree with
the defaults' token at >= MIN_AGREEMENT of the positions, and its mean log-probability of those tokens may drift by
at most MAX_DRIFT_NATS. The verdicts are pure (`identity_verdict`, `drift_verdict`); the engine calls are below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx2

from blazar.events.tuning import Posture

# Bounds of the approximate guard. q8_0 keeps 8 bits per value and typically agrees on top-1 at >= 0.98 with a mean
# drift of a few hundredths of a nat; q4_0 is where quality visibly starts to go. 0.9 / 0.1 nats admit the first
# and refuse a cache that changes one greedy choice in ten or shifts the model's confidence by ~10% per token.
MIN_AGREEMENT = 0.9
MAX_DRIFT_NATS = 0.1
GUARD_TOKENS = 48  # tokens generated per guard prompt
TOP_N = 10  # alternatives asked per position: the reference token's log-probability is almost always among them


@dataclass(frozen=True)
class GuardResult:
    passed: bool
    detail: str


def guard_kind(posture: Posture) -> str:
    """"identity" (greedy output must be token-identical) or "drift" (top-1 agreement and log-probability drift)."""
    return "identity" if posture.lossless() and posture.flash_attn is None else "drift"


def identity_verdict(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> GuardResult:
    """Each prompt's greedy token ids under the candidate must equal the defaults'."""
    if len(reference) != len(candidate):
        return GuardResult(False, f"{len(candidate)} outputs for {len(reference)} prompts")
    for i, (ref, got) in enumerate(zip(reference, candidate, strict=True), 1):
        if list(ref) != list(got):
            at = next((j for j, (a, b) in enumerate(zip(ref, got, strict=False)) if a != b), min(len(ref), len(got)))
            return GuardResult(False, f"greedy output differs from the defaults' on prompt {i} at token {at + 1} "
                                      f"of {len(ref)}")
    total = sum(len(r) for r in reference)
    return GuardResult(True, f"token-identical to the defaults over {len(reference)} prompts ({total} tokens)")


@dataclass(frozen=True)
class Scored:
    """One position of a teacher-forced pass: the engine's top-1 there, and its log-probability of the reference
    token (None when that token was not among the TOP_N alternatives)."""

    top1: int
    ref_logprob: float | None
    floor_logprob: float  # the lowest logprob listed: stands in for a reference token outside the list


def drift_verdict(reference: Sequence[int], base: Sequence[Scored], cand: Sequence[Scored], *,
                  min_agreement: float = MIN_AGREEMENT, max_drift: float = MAX_DRIFT_NATS) -> GuardResult:
    """`base` and `cand` scored along the same `reference` tokens (the defaults' greedy continuation)."""
    if not reference or len(base) != len(reference) or len(cand) != len(reference):
        return GuardResult(False, "no positions to compare")
    agree = sum(1 for r, c in zip(reference, cand, strict=True) if c.top1 == r) / len(reference)

    def lp(s: Scored) -> float:
        return s.ref_logprob if s.ref_logprob is not None else s.floor_logprob

    drift = abs(sum(map(lp, cand)) - sum(map(lp, base))) / len(reference)
    detail = (f"top-1 agreement {agree:.3f} (>= {min_agreement}), mean logprob drift {drift:.3f} nats "
              f"(<= {max_drift}) over {len(reference)} tokens")
    return GuardResult(agree >= min_agreement and drift <= max_drift, detail)


# --- the engine side: llama-server's /tokenize and /completion ------------------------------------------------


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def tokenize(client: httpx2.AsyncClient, base_url: str, api_key: str | None, text: str) -> list[int]:
    r = await client.post(f"{base_url}/tokenize", json={"content": text, "add_special": True},
                          headers=_headers(api_key))
    r.raise_for_status()
    return [int(t) for t in r.json()["tokens"]]


async def _complete(client: httpx2.AsyncClient, base_url: str, api_key: str | None,
                    body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(f"{base_url}/completion", headers=_headers(api_key), json={
        "temperature": 0, "top_k": 1, "seed": 0, "return_tokens": True, **body})
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


async def greedy_tokens(client: httpx2.AsyncClient, base_url: str, api_key: str | None, prompt: list[int],
                        n: int = GUARD_TOKENS) -> list[int]:
    """The greedy continuation's token ids (the prompt is token ids, so both sides see exactly the same input)."""
    out = await _complete(client, base_url, api_key, {"prompt": prompt, "n_predict": n, "cache_prompt": False})
    return [int(t) for t in out.get("tokens") or []]


async def score_along(client: httpx2.AsyncClient, base_url: str, api_key: str | None, prompt: list[int],
                      reference: list[int]) -> list[Scored]:
    """Teacher-forced: at each position of `reference`, the engine's top-1 after prompt + reference[:i] and its
    log-probability of reference[i]. One one-token request per position (the cached prefix makes each cheap)."""
    scored: list[Scored] = []
    for i, ref in enumerate(reference):
        out = await _complete(client, base_url, api_key, {"prompt": prompt + reference[:i], "n_predict": 1,
                                                           "n_probs": TOP_N, "cache_prompt": True})
        probs = out.get("completion_probabilities") or []
        if not probs:
            raise ValueError("the engine returned no probabilities")
        tops = probs[0].get("top_logprobs") or []
        ref_lp = next((float(t["logprob"]) for t in tops if int(t["id"]) == ref), None)
        floor = min((float(t["logprob"]) for t in tops), default=float(probs[0]["logprob"]))
        scored.append(Scored(top1=int(probs[0]["id"]), ref_logprob=ref_lp, floor_logprob=floor))
    return scored
