"""`ActionRuntime`: admission, execution, deadlines, cancellation, compensation and recovery.

One class built from parts, one module each: `core` (creating, proposing, starting), `base`
(shared state and execution machinery), `reads`, `decisions` (cancel, confirm, approve),
`compensation` and `recovery`.
"""

from pipecat_actions.approvals import ApprovalRefused
from pipecat_actions.runtime.core import ActionRuntime

__all__ = ["ActionRuntime", "ApprovalRefused"]
