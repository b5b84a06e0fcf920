"""Incremental detokenization for streamed output (pure: token ids in, text out): the Serve router's chunks and
``jobs/generate.py``'s terminal output."""

from __future__ import annotations


class TextStreamer:
    """Incremental detokenization: never emits half a UTF-8 character or the start of a stop string, and cuts the
    text before the first stop string (OpenAI leaves the stop sequence out)."""

    def __init__(self, decode, stop_strings: list[str]):
        self.decode = decode
        self.stops = stop_strings
        self.tokens: list[int] = []
        self.sent = 0

    def push(self, tokens: list[int], final: bool = False) -> str:
        self.tokens.extend(tokens)
        text = self.decode(self.tokens)
        hits = [text.find(s) for s in self.stops if s in text]
        if hits:
            text = text[: min(hits)]
        elif not final:
            text = text.rstrip("\ufffd")
            for k in range(min(len(text), max((len(s) for s in self.stops), default=1) - 1), 0, -1):
                if any(s.startswith(text[-k:]) for s in self.stops):
                    text = text[:-k]
                    break
        delta = text[self.sent :] if len(text) > self.sent else ""
        self.sent = max(self.sent, len(text))
        return delta
