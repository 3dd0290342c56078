"""Import paths that moved: each old module forwards for one release, with a DeprecationWarning.

The Pipecat adapters moved under `pipecat_actions.adapters` (0.2.0); the old modules
(``pipecat_actions.binding``, ``.processors``, ``.realtime``, ``.flows``, ``.pipeline``) stay
until 0.3.0 as forwarders that warn once, when first imported, naming the new path.
"""

from __future__ import annotations

__all__ = ["moved"]

import warnings


def moved(old: str, new: str) -> None:
    """Warn that module ``old`` moved to ``new`` (called by ``old`` as it is imported)."""
    warnings.warn(
        f"{old} is deprecated and goes in 0.3.0: import from {new} instead (the Pipecat "
        "adapters live in pipecat_actions.adapters)",
        DeprecationWarning,
        stacklevel=3,
    )
