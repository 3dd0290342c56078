"""Observability: correlation ids on log lines, and log redaction."""
