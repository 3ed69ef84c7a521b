"""swafuzz: differential fuzzing of cached SWA write locations against a reference."""

from .api import SUBJECT_API_VERSION, SUPPORTED_API_VERSIONS, ForwardBatch, ForwardMode, ModelSpec, Subject, Truth, tokens_request_slots
from .diagnosis import Divergence
from .executor import RunResult, SubjectError, run_scenario

__version__ = "0.1.0"

__all__ = [
    "SUBJECT_API_VERSION", "SUPPORTED_API_VERSIONS", "Divergence", "ForwardBatch", "ForwardMode", "ModelSpec",
    "RunResult", "Subject", "SubjectError", "Truth", "run_scenario", "tokens_request_slots",
]
