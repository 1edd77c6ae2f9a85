"""The one error a dialect's translation raises for a request it cannot serve: rendered by the API layer as a 400
in the caller's own shape (OpenAI, Anthropic or Ollama)."""

from __future__ import annotations

from blazar.errors import BlazarError


class DialectError(BlazarError):
    status = 400

    def __init__(self, message: str, *, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.code = code
