"""A spoken answer's sentences as its text arrives: `SentenceSplitter` takes a chat's text deltas and hands out each
sentence the moment it ends (blazar/adapters/audio.py `sentence_ends`, the rule `split_sentences` cuts whole texts
by), so piper speaks the first while the model writes the second. The first sentence may end early: at a comma,
semicolon or colon once it holds `first_clause_words` words, and with none of those at a space once it holds
`first_most_words`, since the first sound is what a listener waits for.
Pieces are the text as it came (whitespace kept): joined, they are the answer's transcript. Pure."""

from __future__ import annotations

import re

from blazar.adapters.audio import sentence_ends, speakable

FIRST_CLAUSE_WORDS = 6
FIRST_MOST_WORDS = 10  # a first sentence this long with no clause ends yet is spoken so far (a run-on: p95's tail)
MAX_CHARS = 400  # a sentence longer than this is cut (as split_sentences cuts), at a clause or a space
_CLAUSE = re.compile(r"[,;:]\s+")
_WORD = re.compile(r"\S+\s+")


class SentenceSplitter:
    def __init__(self, first_clause_words: int = FIRST_CLAUSE_WORDS, max_chars: int = MAX_CHARS,
                 first_most_words: int = FIRST_MOST_WORDS) -> None:
        self.first_clause_words = first_clause_words
        self.first_most_words = first_most_words
        self.max_chars = max_chars
        self.rest = ""  # text not handed out yet
        self.first = True  # no sentence handed out yet

    def feed(self, delta: str) -> list[str]:
        """The sentences `delta` completes, each with something to say (a piece with no letter or digit, such as
        "... ", waits to go with the next one)."""
        self.rest += delta
        pieces: list[str] = []
        start = 0
        for end in sentence_ends(self.rest):
            pieces.append(self.rest[start:end])
            start = end
        rest = self.rest[start:]
        if self.first and not any(speakable(p) for p in pieces):
            at = self._clause_end("".join(pieces) + rest)
            if at is not None:
                joined = "".join(pieces) + rest
                pieces, rest = [joined[:at]], joined[at:]
        while len(rest) > self.max_chars:
            at = _cut_at(rest, self.max_chars)
            pieces.append(rest[:at])
            rest = rest[at:]
        out: list[str] = []
        carry = ""
        for piece in pieces:
            carry += piece
            if speakable(carry):
                out.append(carry)
                carry = ""
        self.rest = carry + rest
        if out:
            self.first = False
        return out

    def finish(self) -> list[str]:
        """What is left once the text is complete: the last sentence (it may have nothing to say: "...")."""
        rest, self.rest = self.rest, ""
        return [rest] if rest else []

    def _clause_end(self, text: str) -> int | None:
        for m in _CLAUSE.finditer(text):
            if len(text[:m.start()].split()) >= self.first_clause_words:
                return m.end()
        words = [m.end() for _, m in zip(range(self.first_most_words), _WORD.finditer(text), strict=False)]
        return words[-1] if len(words) == self.first_most_words else None


def _cut_at(text: str, max_chars: int) -> int:
    """Where a sentence over `max_chars` is cut: after its last comma or semicolon before the limit, else at its last
    space, else at the limit (as blazar/adapters/audio.py `cut_sentence` cuts)."""
    head = text[:max_chars]
    at = max(head.rfind(", "), head.rfind("; "))
    if at > 0:
        return at + 2
    space = head.rfind(" ")
    return space + 1 if space > 0 else max_chars
