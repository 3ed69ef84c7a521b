"""The graph runner's metadata steps, checked for where they leave the SWA store rows.

A CUDA graph captured over a forward reads and writes its tensors by address. Before each
replay SGLang carries the freshly built metadata into the captured objects: a full replay
merges them with the metadata classes' ``copy_`` (``replay_cuda_graph_metadata_from``
calls it), a breakable graph (0.5.13+) with ``refresh_for_breakable_cuda_graph_replay_``
(``prepare_forward_metadata_for_breakable_cuda_graph_replay`` calls it). A field whose
rows a store inside the graph reads must then hold the new rows at the captured address:
content copied in place. A field the step reference-assigns leaves the graph reading the
captured tensor, the previous replay's rows (a stale-row finding); one the step leaves
untouched keeps the captured address and the previous rows, which is sound only where the
recorded graph recomputes them itself.

:data:`STEPS` is the table: one row per backend, metadata class and step, with the fields
holding SWA store rows: those the store getter (``get_swa_out_cache_loc`` of either
backend) returns, ``swa_out_cache_loc`` of the attention metadata, and the HIP unified
record's ``swa_loc``, ``verify_store_state_slot`` and ``pf_state_slot`` (the decode ring
rows and state slots its stores write). A store-row field that the release's backend names
in its recorded ``init_forward_metadata_in_graph`` is refilled by the graph on every
replay, so a step may leave or reassign it (0.5.23's ``DSV4AttnMetadata.copy_`` says so of
``swa_out_cache_loc``); every other store-row field must be copied in place.
``raw_out_loc`` is not among them: the getter never reads it (it feeds the compressed
stores). The request window (``request_window_layout``, 0.5.21+) is a record with its own
``copy_`` and is left out here (None on both sides).

The full replay's merge (``copy_``) is also judged for the compressed-KV fields the layers
read inside the graph (:data:`ATTN_COMPRESSED_FIELDS`, each where the release declares it:
``c4_out_loc``, ``c128_out_loc``, the compressed and SWA lengths, ``c128_page_indices``,
``page_table``, ``swa_page_indices``, the V4.1 ``c1_*`` / ``c2_*`` from 0.5.21; the HIP
unified record's ``c4_out_loc`` and ``c128_out_loc``), as a verdict of its own per step
(``... copy_ (compressed-KV fields)``). Every one must end holding the replayed forward's
values in the captured tensor: the copy list copies in place, and a field re-pointed (the
assign list, or a plain assignment) or left out leaves the captured kernels reading the
old storage. No release's in-graph init refills them on a decode or verify replay (0.5.18+'s
CUDA one rebuilds the SWA indices for a DSpark draft block only, and the raw metadata it
upgrades has a merge of its own), so none is exempt. The breakable refresh is not judged for them: it
reference-assigns the tables its attention reads after a graph break (0.5.23's CUDA and
HIP refreshes say so), and which of its fields captured kernels read is not modelled here.
A step that raises (``copy_metadata`` asserts that every field is named) is a finding of
both verdicts, with its message.

What "refilled in graph" rests on: the backend names the field in the in-graph init the
breakable graph records. Whether that init refills ``swa_out_cache_loc`` on a prefill
(extend) replay is not checked here; 0.5.23's
``prepare_forward_metadata_for_breakable_cuda_graph_replay`` adds an in-place copy of the
translated rows when the build leaves them unset, which 0.5.13-0.5.22 lack.

:func:`bind_steps` binds every row a release has, in source mode (the real method and the
real ``copy_metadata`` helper of ``sglang/srt/layers/attention/dsv4/metadata.py``, over
the class rebuilt from the release's own field list, so ``copy_metadata``'s check that
every field is named runs as released). :func:`check_step` builds a captured and a fresh
object with distinct CPU tensors, runs the step and classifies every tensor field as
copied, assigned or untouched by what happened to the captured object.

Where the rest of the runner's sequence stands (0.5.12-0.5.23 wheels, read per release):

============================================  ==========  ==================================
function (file: ``sglang/srt/...``)            releases    SWA store rows, CPU check
============================================  ==========  ==================================
``prepare_forward_metadata_for_breakable_``   0.5.13+     builds fresh metadata, calls the
``cuda_graph_replay``                                     refresh checked here; 0.5.23 then
(``layers/attention/deepseek_v4_backend.py``)             copies translated rows into the
                                                          captured ``swa_out_cache_loc`` in
                                                          place. Not bound: the verdict turns
                                                          on what ``_build_forward_metadata``
                                                          (GPU kernels) leaves in the fresh
                                                          ``swa_out_cache_loc``, which no
                                                          stand-in can say honestly.
``replay_cuda_graph_metadata_from``            all         merges the replay's metadata into
(same file; HIP from 0.5.13)                              the bucket's captured one with
                                                          ``copy_`` and installs it: bound, see
                                                          :func:`check_graph_replay`.
``_install_early_verify_metadata``             0.5.23      merges early-built target-verify
(same file)                                               metadata into the captured one with
                                                          ``copy_`` (which reassigns
                                                          ``swa_out_cache_loc``), then puts the
                                                          captured tensor back holding the new
                                                          rows: bound, see
                                                          :func:`check_early_verify_install`.
``join_in_graph_metadata_prep``                0.5.23      DSpark draft graphs: the first draft
(``model_executor/runner_utils/``                          attention waits on the side stream
``forked_metadata_prep.py``)                              that prepares its metadata (SWA rows
                                                          included) before it stores KV. The
                                                          wait is a CUDA event on the current
                                                          stream, with no CPU meaning: not
                                                          bound (a GPU check would race a
                                                          delayed side-stream write against
                                                          the store).
============================================  ==========  ==================================

:data:`UNBOUND` holds the rows not bound; a test holds each cited function to the releases
named.
"""
from __future__ import annotations

import ast
import dataclasses
import enum
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .binding import BindError, Binding, BoundClass, ClassCode, FunctionCode, bind
from .drivers import StandIn
from .locate import SourceTree, release_key
from .real_classes import RealClass
from .targets import CUDA_BACKEND, CUDA_BACKEND_FILE, HIP_BACKEND, HIP_BACKEND_FILE, POOL_FILE

METADATA_HELPERS_FILE = "sglang/srt/layers/attention/dsv4/metadata.py"
FORKED_PREP_FILE = "sglang/srt/model_executor/runner_utils/forked_metadata_prep.py"
REFRESH = "refresh_for_breakable_cuda_graph_replay_"
MERGE = "copy_"
ATTN_METADATA = "DSV4AttnMetadata"
UNIFIED_METADATA = "UnifiedKvMetadata"

# the fields whose rows the SWA store getter returns (get_swa_out_cache_loc of both backends)
ATTN_STORE_ROWS = ("swa_out_cache_loc",)
UNIFIED_STORE_ROWS = ("swa_loc", "verify_store_state_slot", "pf_state_slot")
# the compressed-KV fields the layers read inside a captured graph (each judged where the
# release declares it): the compressed write locations, the compressed and SWA lengths, the
# ratio-128 and SWA index tables and the page table; the V4.1 ratio-1/2 ones from 0.5.21
ATTN_COMPRESSED_FIELDS = (
    "c4_out_loc", "c128_out_loc", "c4_topk_lengths_raw", "c4_topk_lengths_clamp1", "c4_sparse_topk_lengths",
    "c128_topk_lengths_raw", "c128_topk_lengths_clamp1", "c128_page_indices", "page_table", "swa_page_indices",
    "swa_topk_lengths", "c1_out_loc", "c1_topk_lengths_clamp1", "c1_sparse_topk_lengths", "c2_out_loc",
    "c2_topk_lengths_clamp1", "c2_sparse_topk_lengths",
)
# the HIP unified record's compressed write locations, offset by the unified SWA region
UNIFIED_COMPRESSED_FIELDS = ("c4_out_loc", "c128_out_loc")
COMPRESSED = "compressed-KV fields"
IN_GRAPH_INIT = "init_forward_metadata_in_graph"
# annotations of fields that hold plain configuration (compared, never copied)
_PLAIN_ANNOTATIONS = ("int", "bool", "float", "str", "dict", "Tuple", "tuple", "List[int]", "Literal")
ROWS_PER_FIELD = 4
FRESH_OFFSET = 1000


@dataclass(frozen=True)
class Step:
    """One metadata class's replay step in one backend file."""

    backend: str  # "CUDA" or "HIP"
    path: str
    backend_class: str
    class_name: str
    method: str
    store_rows: tuple[str, ...]
    compressed_rows: tuple[str, ...] = ()  # judged on the full replay's merge (copy_) only

    @property
    def name(self) -> str:
        return f"{self.backend} {self.class_name}.{self.method}"

    @property
    def judges_compressed_rows(self) -> bool:
        return self.method == MERGE and bool(self.compressed_rows)


STEPS = tuple(
    Step(backend, path, backend_class, class_name, method, rows, compressed_rows)
    for backend, path, backend_class, class_name, rows, compressed_rows in (
        ("CUDA", CUDA_BACKEND_FILE, CUDA_BACKEND, ATTN_METADATA, ATTN_STORE_ROWS, ATTN_COMPRESSED_FIELDS),
        ("HIP", HIP_BACKEND_FILE, HIP_BACKEND, ATTN_METADATA, ATTN_STORE_ROWS, ATTN_COMPRESSED_FIELDS),
        # the CUDA backend file has no unified record in any release
        ("HIP", HIP_BACKEND_FILE, HIP_BACKEND, UNIFIED_METADATA, UNIFIED_STORE_ROWS, UNIFIED_COMPRESSED_FIELDS),
    )
    for method in (REFRESH, MERGE)
)


@dataclass(frozen=True)
class Unbound:
    """A step of the runner's sequence read but not run, and why."""

    function: str
    path: str
    first_release: str
    reason: str


UNBOUND = (
    Unbound("prepare_forward_metadata_for_breakable_cuda_graph_replay", CUDA_BACKEND_FILE, "0.5.13",
            "what _build_forward_metadata (GPU kernels) leaves in the fresh swa_out_cache_loc "
            "decides the verdict; the refresh it calls is bound"),
    Unbound("join_in_graph_metadata_prep", FORKED_PREP_FILE, "0.5.23",
            "its effect is a CUDA stream wait, which has no CPU meaning"),
)


@dataclass
class BoundStep:
    step: Step
    version: str | None
    cls: type
    method: Any
    fields: dict[str, str]  # field -> annotation text
    recomputed_in_graph: frozenset[str]  # store-row fields the backend's in-graph init names


@dataclass(frozen=True)
class StepReport:
    """What a step did to each tensor field of the captured object."""

    copied: tuple[str, ...]
    assigned: tuple[str, ...]
    untouched: tuple[str, ...]
    findings: tuple[str, ...]  # store-row fields left stale at the captured address
    compressed_findings: tuple[str, ...] = ()  # compressed-KV fields left stale there (the merge only)


def _recomputed_in_graph(tree: SourceTree, step: Step) -> frozenset[str]:
    """The store-row fields the release's backend class names in its recorded
    ``init_forward_metadata_in_graph``: the graph refills those itself on every replay."""
    text = tree.read(step.path) or ""
    backend = next((n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == step.backend_class), None)
    in_graph = backend and next((n for n in backend.body if isinstance(n, ast.FunctionDef) and n.name == IN_GRAPH_INIT), None)
    if in_graph is None:
        return frozenset()
    named = {n.attr for n in ast.walk(in_graph) if isinstance(n, ast.Attribute)}
    return frozenset(named & set(step.store_rows))


def _class_statements(tree: SourceTree, step: Step) -> tuple[dict[str, str], dict[str, Any]]:
    """The class's field annotations, and its class-level constants (0.5.22+'s HIP refresh
    reads the fields it copies in place from one)."""
    text = tree.read(step.path)
    if text is None:
        raise BindError(f"{tree.label} has no file {step.path}")
    module = ast.parse(text)
    node = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == step.class_name), None)
    if node is None:
        raise BindError(f"{tree.label}: {step.path} has no class {step.class_name}")
    annotated = [s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    fields = {s.target.id: ast.unparse(s.annotation) for s in annotated if "ClassVar" not in ast.unparse(s.annotation)}
    constants = {
        s.target.id: ast.literal_eval(s.value) for s in annotated
        if "ClassVar" in ast.unparse(s.annotation) and s.value is not None
    }
    return fields, constants


# SGLang's helpers every metadata copy_ and refresh calls, and their standard-library names
# (nothing of SGLang's is replaced)
_METADATA_HELPERS = (FunctionCode(METADATA_HELPERS_FILE, "copy_metadata"),
                     FunctionCode(METADATA_HELPERS_FILE, "maybe_copy_inplace"))
_HELPER_NAMES = {"fields": dataclasses.fields, "warnings": warnings}


def bind_step(tree: SourceTree, step: Step) -> BoundStep:
    """``step`` as ``tree`` has it; :class:`BindError` says why not."""
    binding = bind(tree, (*_METADATA_HELPERS, ClassCode(step.path, step.class_name, (step.method,), dataclass_fields=True)),
                   _HELPER_NAMES, {})
    bound: BoundClass = binding.classes[step.class_name]
    cls = bound.build(object)
    fields, constants = _class_statements(tree, step)
    for name, value in constants.items():
        setattr(cls, name, value)
    return BoundStep(step, tree.version, cls, bound.methods[step.method], fields, _recomputed_in_graph(tree, step))


def bind_steps(tree: SourceTree) -> tuple[list[BoundStep], dict[str, str]]:
    """The steps ``tree`` has, in table order, and why each other is absent."""
    found: list[BoundStep] = []
    absent: dict[str, str] = {}
    for step in STEPS:
        try:
            found.append(bind_step(tree, step))
        except BindError as exc:
            absent[step.name] = str(exc)
    return found, absent


def _is_tensor(annotation: str) -> bool:
    return "Tensor" in annotation


def _is_plain(annotation: str) -> bool:
    return not _is_tensor(annotation) and any(word in annotation for word in _PLAIN_ANNOTATIONS)


def _instances(bound: BoundStep) -> tuple[Any, Any]:
    """A captured and a fresh object: every tensor field distinct in address and rows, the
    plain configuration shared (the steps assert it equal), every other record None."""
    shared = {name: object() for name, annotation in bound.fields.items() if _is_plain(annotation)}

    def build(offset: int) -> Any:
        values = {}
        for index, (name, annotation) in enumerate(bound.fields.items()):
            if _is_tensor(annotation):
                start = offset + index * ROWS_PER_FIELD
                values[name] = torch.arange(start, start + ROWS_PER_FIELD, dtype=torch.int32)
            else:
                values[name] = shared.get(name)
        return bound.cls(**values)

    return build(0), build(FRESH_OFFSET)


def check_step(bound: BoundStep, run: Callable[[Any, Any], None] | None = None) -> StepReport:
    """Runs the step (or ``run``, a caller of it) from a fresh object into a captured one and
    classifies every tensor field; a store-row field that does not end with the fresh rows
    at the captured address (and is not recomputed by the graph) is a finding."""
    captured, fresh = _instances(bound)
    before = {name: getattr(captured, name) for name, a in bound.fields.items() if _is_tensor(a)}
    snapshot = {name: tensor.clone() for name, tensor in before.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # copy_metadata warns of fields it assigns; classified below
        (run or bound.method)(captured, fresh)
    copied, assigned, untouched = [], [], []
    for name, tensor in before.items():
        now = getattr(captured, name)
        if now is tensor and torch.equal(now, getattr(fresh, name)):
            copied.append(name)
        elif now is tensor and torch.equal(now, snapshot[name]):
            untouched.append(name)
        else:
            assigned.append(name)
    findings = []
    for name in bound.step.store_rows:
        if name not in before or name in bound.recomputed_in_graph:
            continue
        if name in assigned:
            findings.append(f"{name} is reference-assigned: the captured graph keeps the previous rows")
        elif name in untouched:
            findings.append(f"{name} is left untouched: the captured graph keeps the previous rows")
    return StepReport(tuple(copied), tuple(assigned), tuple(untouched), tuple(findings),
                      _compressed_findings(bound, assigned, untouched))


def _compressed_findings(bound: BoundStep, assigned: list[str], untouched: list[str]) -> tuple[str, ...]:
    """The compressed-KV fields a full replay's merge leaves off the captured tensors: the
    captured kernels read them by address, and nothing in the graph recomputes them."""
    if not bound.step.judges_compressed_rows:
        return ()
    found = []
    for name in bound.step.compressed_rows:
        if name in assigned:
            found.append(f"{name} is re-pointed to the replayed forward's tensor, not copied into the captured one: "
                         "the captured kernels read the previous replay's values")
        elif name in untouched:
            found.append(f"{name} is left out of the merge: the captured tensor keeps the previous replay's values")
    return tuple(found)


KEPT = "store rows at the captured address"
KEPT_COMPRESSED = "compressed-KV fields at the captured address"


@dataclass(frozen=True)
class Verdict:
    """One step of one release: ``findings`` empty when the SWA store rows end at the
    captured address; ``absent`` the reason where the release lacks the step."""

    step: str
    findings: tuple[str, ...] = ()
    detail: str = ""  # what the step did to the fields, for a reader checking by hand
    absent: str = ""
    kept: str = KEPT  # what no finding means



def verdicts(tree: SourceTree) -> list[Verdict]:
    """Every step of the runner's sequence checked here, for ``tree``, in a fixed order: the
    table's steps, each backend's full replay, then the early target-verify install."""
    found, absent = bind_steps(tree)
    out = []
    for bound in found:
        try:
            report = check_step(bound)
        except Exception as exc:  # noqa: BLE001 - the tree's step may raise anything: that is its answer
            raised = (_raised(exc),)
            report = StepReport((), (), (), raised, raised if bound.step.judges_compressed_rows else ())
        refilled = sorted(bound.recomputed_in_graph & set(bound.fields))
        out.append(Verdict(bound.step.name, report.findings,
                           f"copied {', '.join(report.copied) or '-'}; assigned {', '.join(report.assigned) or '-'}; "
                           f"refilled in graph {', '.join(refilled) or '-'}"))
        if bound.step.judges_compressed_rows:
            judged = [name for name in bound.step.compressed_rows if _is_tensor(bound.fields.get(name, ""))]
            out.append(Verdict(f"{bound.step.name} ({COMPRESSED})", report.compressed_findings,
                               f"judged {', '.join(judged) or '-'}", kept=KEPT_COMPRESSED))
    out += [Verdict(name, absent=why) for name, why in absent.items()]
    out += [Verdict(f"{step.name} ({COMPRESSED})", absent=absent[step.name])
            for step in STEPS if step.judges_compressed_rows and step.name in absent]
    for backend in ("CUDA", "HIP"):
        name = f"{backend} {GRAPH_REPLAY}"
        try:
            report, on_captured = check_graph_replay(tree, backend)
        except BindError as exc:
            out.append(Verdict(name, absent=str(exc)))
            continue
        except Exception as exc:  # noqa: BLE001 - the merges it calls may raise anything: that is their answer
            out.append(Verdict(name, (_raised(exc),)))
            continue
        problems = report.findings + (() if on_captured else ("the backend runs on the fresh metadata, "
                                                              "not the captured one",))
        out.append(Verdict(name, problems, f"assigned {', '.join(report.assigned) or '-'}"))
    try:
        early = check_early_verify_install(tree)
    except BindError as exc:
        out.append(Verdict(EARLY_VERIFY_INSTALL, absent=str(exc)))
    except Exception as exc:  # noqa: BLE001 - as above
        out.append(Verdict(EARLY_VERIFY_INSTALL, (_raised(exc),)))
    else:
        problems = tuple(text for ok, text in (
            (early.kept_address, "swa_out_cache_loc is not the captured tensor after the install"),
            (early.rows_match, "the captured swa_out_cache_loc does not hold the new translated rows"),
            (early.installed_captured, "the backend runs on the fresh metadata, not the captured one"),
        ) if not ok)
        out.append(Verdict(EARLY_VERIFY_INSTALL, problems))
    return out


def _raised(exc: Exception) -> str:
    return f"the step raised {type(exc).__name__}: {exc}"


def describe(tree: SourceTree) -> list[str]:
    """One line per step of ``tree``: what it did to the fields, and its findings (or why it
    is absent)."""
    return [f"{v.step}: absent ({v.absent})" if v.absent else
            f"{v.step}: {v.detail + ': ' if v.detail else ''}{'; '.join(v.findings) or v.kept}"
            for v in verdicts(tree)]


def function_releases(trees: dict[str, SourceTree], path: str, function: str) -> tuple[str, ...]:
    """The releases among ``trees`` whose ``path`` defines ``function`` (at any depth)."""
    found = []
    for version in sorted(trees, key=release_key):
        text = trees[version].read(path)
        if text is not None and any(
            isinstance(n, ast.FunctionDef) and n.name == function for n in ast.walk(ast.parse(text))
        ):
            found.append(version)
    return tuple(found)


def _bind_with_merges(tree: SourceTree, backend: str, method: str, stand_in: type[StandIn], *, refilled: bool,
                      **names: Any) -> tuple[Binding, BoundStep]:
    """``backend``'s ``method`` (a backend step that merges metadata) bound beside both metadata
    classes' real ``copy_``, and the attention metadata's ``copy_`` as a step to classify
    (``refilled``: the store-row fields the recorded graph refills are exempt)."""
    merge = next(s for s in STEPS if s.backend == backend and s.class_name == ATTN_METADATA and s.method == MERGE)
    binding = bind(
        tree,
        (*_METADATA_HELPERS,
         ClassCode(merge.path, ATTN_METADATA, (MERGE,), dataclass_fields=True),
         ClassCode(merge.path, METADATA, (MERGE,), dataclass_fields=True),
         ClassCode(merge.path, merge.backend_class, (method,), role=stand_in.role)),
        {**_HELPER_NAMES, **names},
        {stand_in.role: stand_in.attributes},
    )
    attn = BoundStep(merge, tree.version, binding.classes[ATTN_METADATA].build(object),
                     binding.classes[ATTN_METADATA].methods[MERGE], _class_statements(tree, merge)[0],
                     _recomputed_in_graph(tree, merge) if refilled else frozenset())
    return binding, attn


# ---- the 0.5.23 early target-verify install ---------------------------------------------------


EARLY_VERIFY_INSTALL = "_install_early_verify_metadata"
METADATA = "DSV4Metadata"


class GraphBucket(enum.Enum):
    """The backend's graph buckets (SGLang's ``_GraphBucket``); the install reads one."""

    DECODE_OR_IDLE = "decode_or_idle"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND = "draft_extend"


class EarlyVerifyBackend(StandIn):
    role = "early-verify backend"
    attributes = frozenset({
        "make_forward_metadata_from_raw_verify", "online_c128_mtp", "token_to_kv_pool",
        "tail_forward_metadata", "cuda_graph_metadata_of_bucket_and_bs",
        "_early_verify_metadata_ids", "forward_metadata",
    })
    replaces = (RealClass(CUDA_BACKEND_FILE, CUDA_BACKEND),)


class SwaTranslatingPool(StandIn):
    """A pool without request window or draft ring, translating by its mapping."""

    role = "early-verify pool"
    attributes = frozenset({"request_window", "swa_req_ring_size", "translate_loc_from_full_to_swa"})
    replaces = (RealClass(POOL_FILE, "DeepSeekV4TokenToKVPool"),)


class OnlineC128State(StandIn):
    role = "online c128 state"
    attributes = frozenset({"state_slot_offset"})


@dataclass(frozen=True)
class EarlyVerifyReport:
    kept_address: bool  # the captured swa_out_cache_loc tensor is the one left installed
    rows_match: bool  # and it holds the fresh forward's translated rows
    installed_captured: bool  # the backend's forward metadata is the captured object


def check_early_verify_install(tree: SourceTree) -> EarlyVerifyReport:
    """Runs the release's ``_install_early_verify_metadata`` (0.5.23+) over a captured
    target-verify graph's metadata with a fresh build from its real ``copy_``, and reports
    whether the SWA write rows end at the captured address. :class:`BindError` where the
    release lacks it."""
    # the install itself puts the SWA rows back: nothing is left to the graph to refill
    binding, attn = _bind_with_merges(tree, "CUDA", EARLY_VERIFY_INSTALL, EarlyVerifyBackend, refilled=False,
                                      _GraphBucket=GraphBucket)
    captured_core, fresh_core = _instances(attn)
    fresh_core.swa_out_cache_loc = None  # the full build leaves the SWA rows to the install
    metadata_cls = binding.classes[METADATA].build(object)
    captured = metadata_cls(core_attn_metadata=captured_core)
    fresh = metadata_cls(core_attn_metadata=fresh_core)
    captured_rows = captured_core.swa_out_cache_loc
    mapping = torch.arange(4 * FRESH_OFFSET, dtype=torch.int64).flip(0)  # no row maps to itself
    out_cache_loc = torch.arange(ROWS_PER_FIELD, dtype=torch.int64) * 7 + 3
    pool = SwaTranslatingPool(request_window=None, swa_req_ring_size=None,
                              translate_loc_from_full_to_swa=lambda loc: mapping[loc])
    graph_key = 8
    backend = binding.classes[CUDA_BACKEND].build(EarlyVerifyBackend)(
        make_forward_metadata_from_raw_verify=lambda **_: fresh,
        online_c128_mtp=OnlineC128State(state_slot_offset=lambda: 0),
        token_to_kv_pool=pool, tail_forward_metadata=None,
        cuda_graph_metadata_of_bucket_and_bs={GraphBucket.TARGET_VERIFY: {(graph_key, "early"): captured}},
        _early_verify_metadata_ids=set(), forward_metadata=None,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend._install_early_verify_metadata(graph_key=graph_key, raw_metadata=None, out_cache_loc=out_cache_loc)
    installed = captured.core_attn_metadata.swa_out_cache_loc
    return EarlyVerifyReport(
        kept_address=installed is captured_rows,
        rows_match=installed is not None and torch.equal(installed, mapping[out_cache_loc].to(torch.int32)),
        installed_captured=backend.forward_metadata is captured,
    )


# ---- the full graph replay's metadata merge ----------------------------------------------------


GRAPH_REPLAY = "replay_cuda_graph_metadata_from"


class GraphReplayBackend(StandIn):
    role = "graph-replay backend"
    attributes = frozenset({"cuda_graph_metadata_of_bucket_and_bs", "forward_metadata"})
    replaces = (RealClass(CUDA_BACKEND_FILE, CUDA_BACKEND),)


def check_graph_replay(tree: SourceTree, backend: str) -> tuple[StepReport, bool]:
    """Runs the ``backend`` ("CUDA" or "HIP") backend's ``replay_cuda_graph_metadata_from``
    of ``tree`` with a full ``DSV4Metadata`` for a bucket captured before, over the real
    ``copy_`` of both metadata classes. Returns the attention metadata's classification and
    whether the backend then runs on the captured object."""
    binding, attn = _bind_with_merges(tree, backend, GRAPH_REPLAY, GraphReplayBackend, refilled=True)
    metadata_cls = binding.classes[METADATA].build(object)
    backend_cls = binding.classes[attn.step.backend_class].build(GraphReplayBackend)
    batch_size, bucket = 4, GraphBucket.DECODE_OR_IDLE
    installed = []

    def replay(captured_core: Any, fresh_core: Any) -> None:
        captured = metadata_cls(core_attn_metadata=captured_core)
        runner = backend_cls(cuda_graph_metadata_of_bucket_and_bs={bucket: {batch_size: captured}},
                             forward_metadata=None)
        runner.replay_cuda_graph_metadata_from(batch_size, metadata_cls(core_attn_metadata=fresh_core), bucket)
        installed.append(runner.forward_metadata is captured)

    return check_step(attn, replay), installed == [True]


if __name__ == "__main__":
    import sys

    from .locate import wheel

    for version in sys.argv[1:]:
        print(f"== sglang {version}")
        print("\n".join(describe(wheel(version))))
