"""`ActionRuntime`: admission, execution, deadlines, cancellation, compensation and recovery.

A typed facade (`core`) over parts built with their collaborators, one module each, composed
(never mixed in):

* `_operations`: the registry of the operations this process tracks (`Tracked` records, which
  operation each tool call became, outcome listeners, the runtime's tasks);
* `_runner`: starting and running admitted operations;
* `proposals`: one proposed call, from admission to its tool result;
* `reads`: reads, run in the caller's task and audited in batches;
* `decisions`: cancel, confirm, approve, reject;
* `compensation`: reversing a committed operation with a linked one;
* `automatic_compensation`: ``compensation.automatic``, undoing a superseded commit;
* `recovery`: the lease heartbeat, a dead owner's operations, reconciling UNKNOWN;
* `_joins`: the calls that join an operation (their audit notes, their shared wait);
* `_parts`: the wiring.

What a deadline does is `pipecat_actions.execution.expiry`, next to the watchdog.
"""

from pipecat_actions.approvals import ApprovalRefused
from pipecat_actions.runtime.core import ActionRuntime

__all__ = ["ActionRuntime", "ApprovalRefused"]
