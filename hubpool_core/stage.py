"""The placement-stage contract.

A stage plugin registers :class:`Stage` subclasses through ``hubpool_register_stages``.
The pipeline sorts stages by ``order`` once at startup and, per request, calls each
enabled stage with the ranked candidate list. A stage whose knob is off is not called,
so a ranking with the stage off is the ranking without the stage.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

#: Where the core applies the operator pin among the stages: stages ordered below run before
#: it (affinity, the splits, contention), stages at or above it run after (the much-slower
#: rule). Withheld engines are moved last by the core after every stage.
PIN_ORDER = 700


class Stage(ABC):
    """One reordering rule of placement.

    A stage instance is made once per node (``Stage(node)``) and called per request with a
    :class:`hubpool_core.placement.PlacementContext`. Besides :meth:`apply`, a stage may
    observe the walk through :meth:`placed`, :meth:`failed_over` and :meth:`exhausted`
    (for example to remember where a session ran); those run on the request path too and
    must be cheap and never raise.
    """

    #: Plugin-visible name (``context_cap``).
    name: ClassVar[str]
    #: The routing-log row key this stage writes (``contextCap``).
    section: ClassVar[str]
    #: Position in the pipeline, with gaps (100, 200, ...); see :data:`PIN_ORDER`.
    order: ClassVar[int] = 500

    def __init__(self, node: Any = None) -> None:
        self.node = node

    def placed(self, context: Any, candidate: Any) -> None:  # noqa: B027 - optional hook, a no-op by default
        """The walk is about to try ``candidate`` first (placement time)."""

    def failed_over(self, context: Any, candidate: Any) -> None:  # noqa: B027 - optional hook, a no-op by default
        """The walk moved on to ``candidate`` after an earlier one failed."""

    def exhausted(self, context: Any) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Every candidate failed (or there was none)."""

    def enabled(self, context: Any) -> bool:
        """Whether the stage's own knob is on for this request. Read per request;
        ``False`` means the stage is not called and writes a ``None`` section."""
        return True

    @abstractmethod
    def apply(self, ranking: Sequence[Any], context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        """Return the reordered candidates and this stage's routing-log section.

        Must be a pure function of its inputs: never drop a candidate, never add one,
        and return the list unchanged with a ``None`` section when it has nothing to
        say. It must not block or perform I/O (it runs on the request path)."""
