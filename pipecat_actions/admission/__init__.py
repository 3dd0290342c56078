"""Admission: the ordered checks a proposed tool call passes before anything happens.

Admission decides and never executes: the runtime acts on its decisions and the executor runs
what it admitted.
"""
