"""The restaurant agent's actions: kept in the package (`pipecat_actions.testing.restaurant`)."""

from pipecat_actions.testing.restaurant import RESTAURANT, build_actions, new_system_of_record

__all__ = ["RESTAURANT", "build_actions", "new_system_of_record"]
