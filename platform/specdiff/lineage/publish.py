"""Moved to ``specdiff.runtime.publish`` (atomic writes are used on every rung, models included, and lineage sits
above models); kept importable from here for code written against the old path."""

from specdiff.runtime.publish import STALE_AFTER_S, publishing, sweep, write_text  # noqa: F401
