"""The table of SGLang targets: what code each binds, which releases have it, how it runs.

Release ranges were read off the published wheels (0.5.10 to 0.5.23); ``last`` is None
where the newest release checked still has the target. Binding never trusts the range: it
looks for the code itself, so a checkout of any branch binds whatever it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...api import CodeNames
from ..info import SubjectInfo
from .binding import Binding, BindError, ClassCode, FunctionCode, bind
from .drivers import (
    CORE_METADATA_CLASS,
    METADATA_CLASS,
    POOL_CLASS,
    STAND_IN_ATTRIBUTES,
    STAND_INS,
    STANDARD_NAMES,
    UNIFIED_METADATA_CLASS,
    DraftBlocks,
    EngineEnvironment,
    PoolStoreSubject,
    RingMergeSubject,
    RingSubject,
    SglangSubject,
    TranslatedLocSubject,
)
from .faults import defined_at, told_in_sglang_terms
from .locate import SourceTree
from .statements_run import StatementsRun
from .late_layer_tail import bind_tail_code
from .request_window import bind_window_code

POOL_FILE = "sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
CUDA_BACKEND_FILE = "sglang/srt/layers/attention/deepseek_v4_backend.py"
HIP_BACKEND_FILE = "sglang/srt/layers/attention/deepseek_v4_backend_hip_radix.py"
METADATA_FILE = "sglang/srt/layers/attention/dsv4/metadata.py"
CUDA_BACKEND = "DeepseekV4AttnBackend"
HIP_BACKEND = "DeepseekV4HipRadixBackend"
WINDOW_GETTER = "get_swa_out_cache_loc"

# the subject methods the executor calls, each of which runs SGLang code
LIFECYCLE = ("register_mapping", "init_forward_metadata", "swa_write_location", "init_capture_metadata",
             "init_graph_metadata", "init_replay_metadata")

# what SGLang code is handed of the engine's, by the names it knows it by
HANDED_AS = {
    "out_cache_loc": "forward_batch.out_cache_loc",
    "positions": "forward_batch.positions",
    "req_pool_indices": "forward_batch.req_pool_indices",
    "mapping": f"{POOL_CLASS}.full_to_swa_index_mapping",
}

# the ring getter and the producer of the rows it caches (decode metadata)
RING_METHODS = ("get_unified_swa_loc", "_attach_unified_kv_decode_streams")

# the drivers call register_mapping where the pool defines it; every method the entry
# methods reach (a helper the store calls) is bound with them
_POOL_TRANSLATION = ClassCode(POOL_FILE, POOL_CLASS, ("translate_loc_from_full_to_swa",), role="pool",
                              if_defined=("register_mapping",))


def _pool_store(store: str) -> ClassCode:
    # raw_loc: the store translates full-pool locations itself (0.5.13 moved that out)
    return ClassCode(POOL_FILE, POOL_CLASS, (store,), role="pool", parameters={store: "raw_loc"},
                     if_defined=("register_mapping",))


def _metadata_records(path: str) -> tuple[ClassCode, ...]:
    """The backend file's metadata dataclasses, whose declared fields (and defaults) the
    drivers' metadata objects carry, where the tree has them."""
    return tuple(ClassCode(path, name, dataclass_fields=True, required=False)
                 for name in (METADATA_CLASS, CORE_METADATA_CLASS))


@dataclass(frozen=True)
class Target:
    name: str
    summary: str
    driver: type[SglangSubject]
    code: tuple[ClassCode | FunctionCode, ...]
    first: str
    last: str | None = None
    driver_settings: tuple[tuple[str, object], ...] = ()
    called_as: tuple[str, ...] = ()  # the entry methods the engine's code calls (swafuzz.subjects.sglang.callsites)
    # the getter's request-window branch (0.5.21+): the driver's pool holds the tree's own
    # RequestWindow when the run sets the window's switch
    drives_request_window: bool = False
    # the getter's late-layer tail branch (0.5.21+): the driver's extends run their late
    # layers on the tail metadata it builds with the tree's late_layer_tail_layout when the
    # run sets decoder SWA bounded replay
    drives_late_layer_tail: bool = False
    # DSpark draft blocks (0.5.16+): how the driver makes each block's metadata on a DSpark
    # draft model; None: it runs none
    draft_blocks: DraftBlocks | None = None

    @property
    def subject_name(self) -> str:
        return f"sglang:{self.name}"

    def bind(self, tree: SourceTree, mode: str = "source", supplied: Mapping[str, Any] | None = None,
             environment: EngineEnvironment | None = None) -> Binding:
        """``supplied``: values for names the tree's code reads that swafuzz cannot derive;
        ``environment``: what the code's ``envs`` reads (a fresh one by default)."""
        stand_ins = {**STANDARD_NAMES, **STAND_INS, "envs": environment or EngineEnvironment()}
        return bind(tree, self.code, stand_ins, STAND_IN_ATTRIBUTES, mode, supplied)

    def subject(self, binding: Binding, environment: EngineEnvironment,
                window: tuple[Any, str] = (None, ""), tail: tuple[Any, str] = (None, "")) -> type[SglangSubject]:
        """The driver over ``binding``: its findings name the SGLang function that answers
        (the entry method, at its ``def`` line), and what SGLang code raises in it is told
        as that code's fault (:mod:`.faults`); the statements of the entry method that its
        calls run are tallied (:mod:`.statements_run`). ``window``, ``tail``: the tree's
        request window and late-layer tail layout for the driver, or None and why it has none."""
        version = (binding.version or "source").replace(".", "_")
        class_name = f"Sglang_{self.name.replace('-', '_')}_{version}_{binding.mode}"
        owner = next(bound for bound in binding.classes.values() if self.called_as[0] in bound.methods)
        entry = owner.methods[self.called_as[0]]
        function, place = defined_at(entry)
        runs = self._runs(binding)
        # the classes the driver builds from the binding run the marked entry method
        statements, owner.methods[self.called_as[0]] = StatementsRun.marking(entry, f"{function} ({place})")
        window_code, window_absent = window
        tail_code, tail_absent = tail
        return type(class_name, (self.driver,), {
            "binding": binding, "environment": environment, "__doc__": f"{self.summary} ({binding.label}).",
            "answered_by": f"{function} ({place}) {self.driver.answer_verb}",
            "code_names": CodeNames({method: " and ".join(f"{name} ({at})" for name, at in found)
                                     for method, found in runs.items()}, HANDED_AS),
            "window_code": window_code, "window_absent": window_absent,
            "tail_code": tail_code, "tail_absent": tail_absent,
            # the constructor builds the tree's pool and backend: a hang or raise there is theirs too
            **{name: told_in_sglang_terms(getattr(self.driver, name)) for name in ("__init__", *LIFECYCLE)},
            "statements_run": statements,
            **dict(self.driver_settings),
        })

    def _runs(self, binding: Binding) -> dict[str, list[tuple[str, str]]]:
        """Per driver method, the bound SGLang functions it runs, each named and placed at its
        ``def`` line (the store call runs the entry method); a method that runs none is left out."""
        defined = {name: function for bound in binding.classes.values() for name, function in bound.methods.items()}
        runs = {**self.driver.runs, "swa_write_location": (self.called_as[0],)}
        found = {method: [defined_at(defined[name]) for name in functions if name in defined]
                 for method, functions in runs.items()}
        return {method: functions for method, functions in found.items() if functions}

    def request_window(self, tree: SourceTree, mode: str, binding: Binding) -> tuple[Any, str]:
        """The tree's request window where the bound getter has a branch for it, else None
        and why not."""
        if not self.drives_request_window:
            return None, f"{self.subject_name} has no request-window branch"
        getter = binding.classes[dict(self.driver_settings)["backend_class_name"]].methods[WINDOW_GETTER]
        if "request_window" not in getter.__code__.co_names:
            return None, f"{binding.label}: {WINDOW_GETTER} has no request-window branch"
        try:
            return bind_window_code(tree, mode), ""
        except BindError as exc:
            return None, f"{binding.label}: the request window does not bind ({exc})"

    def late_layer_tail(self, tree: SourceTree, mode: str, binding: Binding) -> tuple[Any, str]:
        """The tree's ``late_layer_tail_layout`` where the bound getter has a branch for the
        tail, else None and why not."""
        if not self.drives_late_layer_tail:
            return None, f"{self.subject_name} has no late-layer tail branch"
        getter = binding.classes[dict(self.driver_settings)["backend_class_name"]].methods[WINDOW_GETTER]
        if "late_layer_tail" not in getter.__code__.co_names:
            return None, f"{binding.label}: {WINDOW_GETTER} has no late-layer tail branch"
        try:
            return bind_tail_code(tree, mode), ""
        except BindError as exc:
            return None, f"{binding.label}: late_layer_tail_layout does not bind ({exc})"

    def info(self, tree: SourceTree, mode: str = "source", name: str | None = None,
             supplied: Mapping[str, Any] | None = None) -> SubjectInfo:
        """The target bound from ``tree``, not yet configured (:mod:`.configure`)."""
        environment = EngineEnvironment()
        binding = self.bind(tree, mode, supplied, environment)
        subject = self.subject(binding, environment, self.request_window(tree, mode, binding),
                               self.late_layer_tail(tree, mode, binding))
        return SubjectInfo(
            name or self.subject_name, subject, expected="unknown", kind="sglang",
            summary=f"{self.summary} ({binding.label})",
        )

    def releases(self) -> str:
        return f"{self.first}+" if self.last is None else (
            self.first if self.first == self.last else f"{self.first}-{self.last}"
        )


TARGETS: tuple[Target, ...] = (
    Target(
        "pool-fused-store",
        "DeepSeek-V4 pool set_swa_key_buffer_radix_fused with its inline translation cache",
        PoolStoreSubject, (_pool_store("set_swa_key_buffer_radix_fused"),),
        first="0.5.12", last="0.5.12.post1",
        driver_settings=(("store", "set_swa_key_buffer_radix_fused"),),
        called_as=("set_swa_key_buffer_radix_fused",),
    ),
    Target(
        "pool-norm-rope-store",
        "DeepSeek-V4 pool set_swa_key_buffer_radix_fused_norm_rope with its inline translation cache",
        PoolStoreSubject, (_pool_store("set_swa_key_buffer_radix_fused_norm_rope"),),
        first="0.5.12", last="0.5.12.post1",
        driver_settings=(("store", "set_swa_key_buffer_radix_fused_norm_rope"),),
        called_as=("set_swa_key_buffer_radix_fused_norm_rope",),
    ),
    Target(
        "cuda-swa-out-cache-loc",
        "CUDA DeepSeek-V4 backend get_swa_out_cache_loc over per-forward translated locations",
        TranslatedLocSubject,
        (_POOL_TRANSLATION, ClassCode(CUDA_BACKEND_FILE, CUDA_BACKEND, ("get_swa_out_cache_loc",), role="backend"),
         *_metadata_records(CUDA_BACKEND_FILE)),
        first="0.5.13",
        driver_settings=(("backend_class_name", CUDA_BACKEND),),
        called_as=("get_swa_out_cache_loc",), drives_request_window=True, drives_late_layer_tail=True,
        draft_blocks=DraftBlocks.BUILT_BY_TREE,
    ),
    Target(
        "hip-swa-out-cache-loc",
        "HIP DeepSeek-V4 backend get_swa_out_cache_loc over per-forward translated locations",
        TranslatedLocSubject,
        (_POOL_TRANSLATION, ClassCode(HIP_BACKEND_FILE, HIP_BACKEND, ("get_swa_out_cache_loc",), role="backend"),
         *_metadata_records(HIP_BACKEND_FILE)),
        first="0.5.13",
        driver_settings=(("backend_class_name", HIP_BACKEND),),
        called_as=("get_swa_out_cache_loc",), drives_request_window=True, drives_late_layer_tail=True,
        draft_blocks=DraftBlocks.AS_VERIFY,
    ),
    Target(
        "hip-unified-swa-loc",
        "HIP DeepSeek-V4 backend get_unified_swa_loc over per-forward ring rows",
        RingSubject,
        (ClassCode(HIP_BACKEND_FILE, HIP_BACKEND, RING_METHODS, role="backend"), *_metadata_records(HIP_BACKEND_FILE)),
        first="0.5.14",
        driver_settings=(("backend_class_name", HIP_BACKEND),),
        called_as=("get_unified_swa_loc",), draft_blocks=DraftBlocks.AS_VERIFY,
    ),
    Target(
        "unified-metadata-merge",
        "UnifiedKvMetadata.copy_ (the ring-row merge before graph replay) read by get_unified_swa_loc",
        RingMergeSubject,
        (
            ClassCode(HIP_BACKEND_FILE, UNIFIED_METADATA_CLASS, ("copy_",), dataclass_fields=True),
            FunctionCode(METADATA_FILE, "copy_metadata"),
            ClassCode(HIP_BACKEND_FILE, HIP_BACKEND, RING_METHODS, role="backend"),
            *_metadata_records(HIP_BACKEND_FILE),
        ),
        first="0.5.14",
        driver_settings=(("backend_class_name", HIP_BACKEND),),
        called_as=("get_unified_swa_loc",), draft_blocks=DraftBlocks.AS_VERIFY,
    ),
)

_BY_NAME = {target.name: target for target in TARGETS}


def target(name: str) -> Target:
    """A target by its name, with or without the ``sglang:`` prefix."""
    bare = name.removeprefix("sglang:")
    if bare not in _BY_NAME:
        raise BindError(
            f"unknown SGLang target {name!r}; targets are "
            + ", ".join(t.subject_name for t in TARGETS)
        )
    return _BY_NAME[bare]
