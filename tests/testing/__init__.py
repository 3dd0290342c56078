"""Tests of the shipped test doubles (pipecat_actions.testing)."""
