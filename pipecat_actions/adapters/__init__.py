"""Everything that knows Pipecat: the adapters between its pipelines and the runtime's port.

One layer above `pipecat_actions.runtime`. Each adapter turns what its kind of pipeline does
(a handler called, a frame pushed, a provider's event) into calls of the runtime's
conversation port (`pipecat_actions.runtime.calls.Calls`), and pushes what the port answers
(a `ToolResult`, a `Told`) back in its pipeline's own terms:

* `tools`: the tool schemas the model is offered;
* `handlers`: `attach`, one handler per action (with its announcement and filler lines);
* `routed`: the routed-handler core, an application's own handler (or a Flows function's)
  admitted and run as an effect; `instrument` for handlers registered on the LLM;
* `result_gate`, `turn_tracker`, `status_reporter`: the cascade's processors;
* `realtime`: the speech-to-speech adapters (OpenAI Realtime, Gemini Live);
* `flows`: Pipecat Flows, transitions on the operation's truthful status;
* `pipeline`: the pipeline template and `check_placement`;
* `_pipecat_private`: the one module that names what of Pipecat's private parts is touched.

See ``docs/architecture.md`` for the walk of a tool call through the port and the adapters.
"""

from pipecat_actions.adapters.handlers import attach
from pipecat_actions.adapters.pipeline import build_pipeline, check_placement
from pipecat_actions.adapters.result_gate import ActionResultGate
from pipecat_actions.adapters.routed import instrument
from pipecat_actions.adapters.status_reporter import ActionStatusReporter, rtvi_observer_params
from pipecat_actions.adapters.tools import tools_schema
from pipecat_actions.adapters.turn_tracker import ActionTurnTracker

__all__ = [
    "ActionResultGate",
    "ActionStatusReporter",
    "ActionTurnTracker",
    "attach",
    "build_pipeline",
    "check_placement",
    "instrument",
    "rtvi_observer_params",
    "tools_schema",
]
