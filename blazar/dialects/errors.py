"""The one error a dialect's translation raises for a request it cannot serve (blazar/errors.py holds it, with the
rest of the tree): rendered by the API layer as a 400 in the caller's own shape (OpenAI, Anthropic or Ollama)."""

from __future__ import annotations

from blazar.errors import DialectError

__all__ = ["DialectError"]
