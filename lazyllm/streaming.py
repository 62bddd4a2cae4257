"""Streaming: the text of a generation handed out piece by piece while it is decoded.

:class:`IncrementalText` turns the tokens so far into the next piece of text. Pieces only ever extend
what was already handed out, and their concatenation is exactly the blocking call's ``text``: each
step decodes the whole generation (no special tokens) and holds back

* a trailing incomplete UTF-8 character (decoded as U+FFFD until its last byte arrives),
* trailing whitespace (a tokenizer's clean-up may drop a space before the punctuation that follows),
* the last ``L - 1`` characters, ``L`` the longest stop string (they might begin a stop string),

and the end of the generation hands out the rest, cut before the first stop string.

:class:`TextStream` is what :meth:`lazyllm.engine.LazyLLM.stream` returns. Its first piece comes right
after the first token (it may be ``""`` when that token has no text yet), every later piece is
non-empty; ``result`` is the :class:`~lazyllm.results.GenerationResult` once the stream is exhausted,
its ``ttft_s`` the seconds from the call to the first piece. The host reads nothing from the device
beyond the token the engine already reads; the text work is on the host, between device steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Iterator

from lazyllm.results import GenerationResult
from lazyllm.text import StopCriteria


class IncrementalText:
    """The text of one generation, handed out in pieces that only extend it (see the module docstring)."""

    def __init__(self, stop: StopCriteria) -> None:
        if stop.tokenizer is None:
            raise ValueError(
                "streaming text needs a tokenizer: LazyLLM(model, schedule, tokenizer=tokenizer)"
            )
        self.stop = stop
        self.hold = max((len(s) for s in stop.stop_strings), default=1) - 1
        self.sent = ""

    def piece(self, generated: list[int]) -> str:
        """The new text that is certain after ``generated`` (possibly ``""``)."""
        text = self.stop.text(generated) or ""  # cut before a stop string the last token completed
        stable = text[: max(0, len(text) - self.hold)].rstrip("\ufffd").rstrip()
        if len(stable) <= len(self.sent) or not stable.startswith(self.sent):
            return ""
        new, self.sent = stable[len(self.sent) :], stable
        return new

    def rest(self, generated: list[int]) -> str:
        """The text not handed out yet, once ``generated`` is final."""
        final = self.stop.text(generated) or ""
        if not final.startswith(self.sent):  # the decoded text changed under what was sent: a bug
            raise RuntimeError(f"streamed text {self.sent!r} is not a prefix of the final text {final!r}")
        rest, self.sent = final[len(self.sent) :], final
        return rest


class TextStream(Iterator[str]):
    """Pieces of a generation's text as they are decoded; ``result`` once exhausted.

    Args:
        steps: the engine's decoding loop (yields the tokens so far, returns the result).
        text: turns tokens into pieces.
        t0: when the call began (``time.perf_counter()``), for TTFT.
    """

    def __init__(
        self, steps: Generator[list[int], None, GenerationResult], text: IncrementalText, t0: float
    ) -> None:
        self._steps = steps
        self._text = text
        self._t0 = t0
        self._result: GenerationResult | None = None
        self._pieces = self._run()

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    @property
    def result(self) -> GenerationResult:
        """The generation's result (the stream must be exhausted first)."""
        if self._result is None:
            raise RuntimeError("the stream is not finished: iterate it to the end before reading result")
        return self._result

    def _run(self) -> Iterator[str]:
        ttft: float | None = None
        while True:
            try:
                generated = next(self._steps)
            except StopIteration as done:
                final: GenerationResult = done.value
                break
            piece = self._text.piece(generated)
            if ttft is None:
                ttft = time.perf_counter() - self._t0
                yield piece
            elif piece:
                yield piece
        rest = self._text.rest(final.token_ids)
        self._result = dataclasses.replace(final, ttft_s=final.ttft_s if ttft is None else ttft)
        if rest:
            yield rest
