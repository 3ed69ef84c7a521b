"""swafuzz: differential fuzzing of cached SWA write locations against a reference.

The public names load on first use, so that the program entry (:mod:`swafuzz.entry`) can
take over signals before torch and the rest are imported.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The public API, imported on first use: the pytest plugin is part of this package and
# pytest loads it in every session wherever swafuzz is installed, which must not pay for
# importing torch unless swafuzz is asked for.
_EXPORTS = {
    "SUBJECT_API_VERSION": "api", "SUPPORTED_API_VERSIONS": "api", "ForwardBatch": "api", "ForwardMode": "api",
    "ModelSpec": "api",
    "Subject": "api", "Truth": "api", "tokens_request_slots": "api",
    "Divergence": "diagnosis",
    "RunResult": "executor", "SubjectError": "executor", "run_scenario": "executor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
