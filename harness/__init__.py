"""swafuzz: differential fuzzing of cached SWA write locations against a reference.

The public names load on first use, so that the program entry (:mod:`swafuzz.entry`) can
take over signals before torch and the rest are imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

__version__ = "0.1.0"

# The public API, imported on first use: the pytest plugin is part of this package and
# pytest loads it in every session wherever swafuzz is installed, which must not pay for
# importing torch unless swafuzz is asked for.
_EXPORTS = {
    "SUBJECT_API_VERSION": "api", "SUPPORTED_API_VERSIONS": "api", "CodeNames": "api", "ForwardBatch": "api",
    "ForwardMode": "api",
    "ModelSpec": "api",
    "Subject": "api", "Truth": "api", "tokens_request_slots": "api",
    "Divergence": "run.diagnosis",
    "RunResult": "run.executor", "SubjectError": "run.executor", "run_scenario": "run.executor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


# Modules by the names they had before they moved into the folders of their layers: replay
# files, regression tests that swafuzz wrote, and users' own code import them so. Each former
# name is the same module object as the new one, never a second copy.
FORMER_NAMES = {
    "swafuzz.arena": "swafuzz.run.arena",
    "swafuzz.bench": "swafuzz.tools.bench",
    "swafuzz.boundary": "swafuzz.run.boundary",
    "swafuzz.builtin": "swafuzz.subjects.builtin",
    "swafuzz.campaign": "swafuzz.search.campaign",
    "swafuzz.database": "swafuzz.search.database",
    "swafuzz.devices": "swafuzz.run.devices",
    "swafuzz.diagnosis": "swafuzz.run.diagnosis",
    "swafuzz.executor": "swafuzz.run.executor",
    "swafuzz.fuzz": "swafuzz.search.fuzz",
    "swafuzz.graphs": "swafuzz.run.graphs",
    "swafuzz.guard": "swafuzz.run.guard",
    "swafuzz.merge": "swafuzz.results.merge",
    "swafuzz.mutate": "swafuzz.tools.mutate",
    "swafuzz.peer": "swafuzz.tools.peer",
    "swafuzz.pr_gate": "swafuzz.tools.pr_gate",
    "swafuzz.progress": "swafuzz.search.progress",
    "swafuzz.registry": "swafuzz.subjects.registry",
    "swafuzz.replay": "swafuzz.results.replay",
    "swafuzz.reports": "swafuzz.results.reports",
    "swafuzz.sglang": "swafuzz.subjects.sglang",
    "swafuzz.sglang.binding": "swafuzz.subjects.sglang.binding",
    "swafuzz.sglang.callsites": "swafuzz.subjects.sglang.callsites",
    "swafuzz.sglang.configure": "swafuzz.subjects.sglang.configure",
    "swafuzz.sglang.drivers": "swafuzz.subjects.sglang.drivers",
    "swafuzz.sglang.fetch": "swafuzz.subjects.sglang.fetch",
    "swafuzz.sglang.locate": "swafuzz.subjects.sglang.locate",
    "swafuzz.sglang.matrix": "swafuzz.tools.sglang_matrix",
    "swafuzz.sglang.producers": "swafuzz.subjects.sglang.producers",
    "swafuzz.sglang.provenance": "swafuzz.subjects.sglang.provenance",
    "swafuzz.sglang.reachability": "swafuzz.subjects.sglang.reachability",
    "swafuzz.sglang.real_classes": "swafuzz.subjects.sglang.real_classes",
    "swafuzz.sglang.runner_steps": "swafuzz.subjects.sglang.runner_steps",
    "swafuzz.sglang.switches": "swafuzz.subjects.sglang.switches",
    "swafuzz.sglang.targets": "swafuzz.subjects.sglang.targets",
    "swafuzz.shard": "swafuzz.search.shard",
    "swafuzz.unread": "swafuzz.run.unread",
    "swafuzz.worker_heap": "swafuzz.search.worker_heap",
    "swafuzz.workers": "swafuzz.search.workers",
}


class _FormerNames:
    """A meta path finder that answers a former module name with the module it became."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, _FormerNames) if name in FORMER_NAMES else None

    @staticmethod
    def create_module(spec: Any) -> Any:
        return importlib.import_module(FORMER_NAMES[spec.name])

    @staticmethod
    def exec_module(module: Any) -> None:
        pass  # imported whole by create_module


# first, so that a former package's modules never load a second time under the old name
if _FormerNames not in sys.meta_path:
    sys.meta_path.insert(0, _FormerNames)
