"""Execution: running admitted operations, reconciling UNKNOWN ones, and enforcing deadlines."""
