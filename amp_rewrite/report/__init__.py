"""What was decided, for people: the JSON report (:mod:`.build`), ``explain`` (:mod:`.explain`)
and pictures (:mod:`.draw`).  They read plans and reports; none of them decides anything."""

from .build import build_report, nothing_converted_reason

__all__ = ["build_report", "nothing_converted_reason"]
