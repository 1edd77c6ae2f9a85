"""A spoken answer's sentences as its text arrives (`SentenceSplitter`), and what a cut of its audio keeps of its
transcript (`heard`)."""

from __future__ import annotations

import pytest

from blazar.adapters.audio import split_sentences
from blazar.serving.realtime.sentences import SentenceSplitter
from blazar.serving.realtime.voicing import Said, heard

TEXT = ('Dr. Smith said the sky is blue! Why? Because air scatters short waves more than long ones... '
        '"Really?" she asked.\n\nYes. ... And 3,000 more; words')


def fed(text: str, step: int, splitter: SentenceSplitter) -> tuple[list[str], list[str]]:
    """The pieces `text` gives fed `step` characters at a time, and what finish leaves."""
    out: list[str] = []
    for at in range(0, len(text), step):
        out += splitter.feed(text[at:at + step])
    return out, splitter.finish()


@pytest.mark.parametrize("step", [1, 3, 7, len(TEXT)])
def test_fed_in_any_pieces_the_sentences_are_the_whole_texts_and_join_back_to_it(step: int) -> None:
    out, rest = fed(TEXT, step, SentenceSplitter(first_clause_words=1000))
    assert "".join(out + rest) == TEXT  # nothing lost, whitespace kept: the transcript
    # The sentences the whole text is cut into, each handed out as soon as it ended.
    pieces = [s.strip() for s in out + rest]
    assert pieces[:-1] == split_sentences(TEXT)[:-1]
    # The "... " with nothing to say goes with what follows (split_sentences drops it): the transcript keeps it.
    assert pieces[-1] == "... And 3,000 more; words" and split_sentences(TEXT)[-1] == "And 3,000 more; words"


def test_a_sentence_is_handed_out_once_it_ends_not_before() -> None:
    s = SentenceSplitter()
    assert s.feed("Hello there.") == []  # the stop may be an abbreviation's or a number's: wait for what follows
    assert s.feed(" How") == ["Hello there. "]
    assert s.feed(" are you") == []
    assert s.finish() == ["How are you"]


def test_a_long_first_sentence_ends_at_a_clause_after_enough_words_and_later_ones_do_not() -> None:
    s = SentenceSplitter(first_clause_words=6)
    assert s.feed("Well, ") == []  # one word before the comma: too early
    assert s.feed("the sky looks blue to us, because") == ["Well, the sky looks blue to us, "]
    assert s.feed(" of air, which scatters light, mostly") == []  # no early end after the first
    assert s.feed(". Done") == ["because of air, which scatters light, mostly. "]


def test_a_sentence_over_the_limit_is_cut_at_a_clause_or_a_space() -> None:
    s = SentenceSplitter(first_clause_words=1000, max_chars=20)
    out = s.feed("one two three, four five six seven eight nine ten")
    assert out == ["one two three, ", "four five six seven ", "eight nine ten"][:len(out)] and len(out) == 2
    assert "".join(out + s.finish()) == "one two three, four five six seven eight nine ten"


def test_heard_keeps_whole_sentences_and_the_cut_ones_words_in_proportion() -> None:
    said = [Said("One two. ", 0, 200), Said("Three four five six. ", 200, 600), Said("", 600, 600)]
    assert heard(said, 600) == said
    assert [s.text for s in heard(said, 200)] == ["One two. "]
    assert [s.text for s in heard(said, 450)] == ["One two. ", "Three four "]  # 250 of 400 ms: 2.5 of 4 words
    assert heard(said, 450)[-1].end_ms == 450
    assert [s.text for s in heard(said, 250)] == ["One two. "]  # not a whole word of the second yet
    assert heard(said, 0) == []


def test_a_first_sentence_with_no_clause_end_is_spoken_after_its_first_words() -> None:
    s = SentenceSplitter(first_clause_words=6, first_most_words=10)
    assert s.feed("one two three four five six seven eight nine") == []  # nine words, and the ninth may go on
    assert s.feed(" ten eleven") == ["one two three four five six seven eight nine ten "]
    assert s.feed(" twelve thirteen fourteen fifteen sixteen seventeen") == []  # only the first is cut early
    assert s.finish() == ["eleven twelve thirteen fourteen fifteen sixteen seventeen"]
