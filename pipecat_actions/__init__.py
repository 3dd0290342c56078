"""pipecat_actions."""
