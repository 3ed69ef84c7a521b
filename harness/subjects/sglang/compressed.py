"""SGLang's compressed-KV metadata kernels, run on CPU and checked value by value against the truth.

``_init_compressed_attn_metadata_kernel`` (``metadata_kernel.py``) is the Triton kernel that
makes, once per forward, the compressed-KV values every C4 and C128 layer reads: the write
locations ``c4_out_loc`` / ``c128_out_loc``, the group positions, the compressed lengths and
the ratio-128 index table. ``DSV4AttnMetadata.init_compression_metadata`` calls it and keeps
what the layers read; the HIP backend's (0.5.13+) also offsets the write locations by the
unified SWA region (``unified_swa_pages``, 0.5.14+). From 0.5.21 the V4.1 ratio-1/2 write
locations and lengths come too: from ``build_low_ratio_metadata`` (a Triton kernel in the
same file) or the backend's own torch code, and on HIP from ``low_ratio_compression_metadata``
(``attn_glue_hip.py``, 0.5.22+).

Every release from 0.5.12 to 0.5.23 has the kernel: in
``sglang/srt/layers/attention/dsv4/metadata_kernel.py`` up to 0.5.15 and in
``sglang/kernels/ops/attention/dsv4/metadata_kernel.py`` from 0.5.16. All of it is bound
from the tree as it is: the kernel files' wrapper functions and the metadata classes through
:func:`~.binding.bind`, the ``@triton.jit`` kernels by compiling their own definitions from
the tree's text. Triton's interpreter (``TRITON_INTERPRET=1``) runs the kernels on CPU
tensors; triton comes with the ``triton`` extra (``pip install 'swafuzz[triton]'``), and
without it :func:`check_release` says the values were not checked, never passes them.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...errors import BindError
from ...reference import compressed as truth
from .binding import ClassCode, FunctionCode, bind
from .interpreted import TRITON_MISSING, defines, record, triton_available, triton_stand_ins
from .locate import SourceTree
from .targets import CUDA_BACKEND_FILE, HIP_BACKEND_FILE

# where the kernel file lives: 0.5.16 to 0.5.23, then 0.5.12 to 0.5.15
KERNEL_FILES = ("sglang/kernels/ops/attention/dsv4/metadata_kernel.py",
                "sglang/srt/layers/attention/dsv4/metadata_kernel.py")
UTILS_FILE = "sglang/srt/utils/common.py"
HIP_GLUE_FILE = "sglang/kernels/ops/attention/dsv4/attn_glue_hip.py"
KERNEL = "_init_compressed_attn_metadata_kernel"
KERNEL_ENTRY = "init_compression_metadata"  # the kernel file's function the backend calls
LOW_RATIO_ENTRY = "build_low_ratio_metadata"  # the V4.1 ratio-1/2 kernel's entry (0.5.21+)
LOW_RATIO_RECORD = "LowRatioMetadata"  # the record it returns
HIP_LOW_RATIO = "low_ratio_compression_metadata"  # the HIP backend's V4.1 kernel entry (0.5.22+)
UNIFIED_RECORD = "UnifiedKvMetadata"  # the HIP per-forward record of unified-KV rows
UNIFIED_PAGES = "unified_swa_pages"  # the HIP init's parameter (0.5.14+)
METADATA_CLASS = "DSV4AttnMetadata"
HIP_METADATA = f"HIP {METADATA_CLASS}"
PAGE_SIZE = 256  # DeepSeek-V4's page size in practice
INDEX_TOPK = 512

# the kernel's outputs in the order it returns them; 0.5.12 returns no c128_lengths_raw
KERNEL_OUTPUTS = ("c4_out_loc", "c4_positions", "c4_lengths_raw", "c4_lengths_clamp1", "c128_out_loc",
                  "c128_positions", "c128_lengths_raw", "c128_lengths_clamp1", "c128_page_indices")
# the metadata fields init_compression_metadata sets, and the truth value each must hold
METADATA_FIELDS = {
    "c4_out_loc": "c4_out_loc",
    "c4_topk_lengths_raw": "c4_lengths_raw",
    "c4_topk_lengths_clamp1": "c4_lengths_clamp1",
    "c128_out_loc": "c128_out_loc",
    "c128_topk_lengths_raw": "c128_lengths_raw",  # the HIP metadata's only
    "c128_topk_lengths_clamp1": "c128_lengths_clamp1",
    "c128_page_indices": "c128_page_indices_padded",
    "c1_out_loc": "c1_out_loc",
    "c1_topk_lengths_clamp1": "c1_lengths_clamp1",
    "c2_out_loc": "c2_out_loc",
    "c2_topk_lengths_clamp1": "c2_lengths_clamp1",
    "swa_page_indices": "swa_page_indices",  # handed in, padded to the index alignment
}
# the record build_low_ratio_metadata returns, field by field, and the truth value of each
LOW_RATIO_OUTPUTS = {
    f"c{ratio}_{field}": value.format(ratio=ratio)
    for ratio in (1, 2)
    for field, value in (("out_loc", "c{ratio}_out_loc"), ("seq_lens", "c{ratio}_lengths_clamp1"),
                         ("sparse_lens", "c{ratio}_sparse_lengths"), ("page_indices", "empty_sparse_page_indices"))
}
# what the metadata needs to carry for init_compression_metadata: every ratio present
PRESENT_RATIOS = (1, 2, 4, 128)


@dataclass
class CompressionMetadataCode:
    """A tree's compression metadata code, bound: its kernel entry and its metadata class."""

    label: str
    kernel_file: str
    kernel: Callable[..., tuple]  # the kernel file's init_compression_metadata
    metadata_class: type  # DSV4AttnMetadata, rebuilt from its fields, with init_compression_metadata
    low_ratio: Callable[..., tuple] | None = None  # build_low_ratio_metadata, where the tree has it
    hip_metadata_class: type | None = None  # the HIP backend's DSV4AttnMetadata, where the tree has it

    @property
    def hip_unified(self) -> bool:
        """Whether the HIP metadata makes the unified-KV compressed locations."""
        return (self.hip_metadata_class is not None
                and UNIFIED_PAGES in inspect.signature(self.hip_metadata_class.init_compression_metadata).parameters)

    @property
    def absent(self) -> tuple[str, ...]:
        """The code this tree lacks, whose values are therefore not checked."""
        return tuple(name for name, there in ((LOW_RATIO_ENTRY, self.low_ratio is not None),
                                              (HIP_METADATA, self.hip_metadata_class is not None),
                                              (f"HIP {UNIFIED_PAGES}", self.hip_unified or self.hip_metadata_class is None))
                     if not there)

    def metadata(self, batch: "CompressionBatch", low_ratio_buffers: tuple | None = None, hip: bool = False) -> Any:
        """A metadata object of ``batch`` (the HIP backend's where ``hip``) after
        ``init_compression_metadata``, handed the low-ratio kernel's ``low_ratio_buffers``
        where given (as small decode batches are) and the unified SWA region's size where
        the HIP metadata takes it."""
        metadata_class = self.hip_metadata_class if hip else self.metadata_class
        positions = batch.positions.to(torch.int32)
        values = {
            "page_size": batch.page_size, "page_table": batch.pages, "raw_out_loc": batch.out_loc,
            "cuda_int32_kwargs": {"device": "cpu", "dtype": torch.int32},
            "seq_lens_casual": positions + 1, "positions_casual": positions,
            "swa_page_indices": batch.swa_page_indices, "swa_topk_lengths": truth.swa_topk_lengths(batch.positions),
            "index_topk": INDEX_TOPK, "c4_sparse_topk": INDEX_TOPK, "present_ratios": PRESENT_RATIOS, "low_ratios": truth.LOW_RATIOS,
        }
        # each release declares its own fields (which ratios a stage has: 0.5.21+)
        declared = {f.name for f in dataclasses.fields(metadata_class)}
        metadata = metadata_class(**{name: value for name, value in values.items() if name in declared})
        init = metadata.init_compression_metadata
        taken = inspect.signature(init).parameters
        arguments = {"num_tokens": batch.out_loc.numel()} if "num_tokens" in taken else {}
        if low_ratio_buffers is not None:
            arguments["low_ratio_buffers"] = low_ratio_buffers
        if UNIFIED_PAGES in taken:
            arguments[UNIFIED_PAGES] = batch.unified_swa_pages
        init(**arguments)
        return metadata


def bind_compression_metadata(tree: SourceTree) -> CompressionMetadataCode:
    """Bind ``tree``'s compression metadata kernel and ``DSV4AttnMetadata.init_compression_metadata``.

    Needs triton (the kernels are compiled as Triton's interpreter runs them); a tree
    without the kernel file raises :class:`BindError` naming where it looked.
    """
    kernel_file = next((path for path in KERNEL_FILES if tree.read(path) is not None), None)
    if kernel_file is None:
        raise BindError(f"{tree.label}: has no compression metadata kernel (looked in {', '.join(KERNEL_FILES)})")
    stand_ins = triton_stand_ins(tree, kernel_file)
    if KERNEL not in stand_ins:
        raise BindError(f"{tree.label}: {kernel_file} has no @triton.jit {KERNEL}")
    entries = [FunctionCode(kernel_file, KERNEL_ENTRY)]
    low_ratio_record = record(tree, kernel_file, LOW_RATIO_RECORD)
    if low_ratio_record is not None:
        entries.append(FunctionCode(kernel_file, LOW_RATIO_ENTRY))
        stand_ins[LOW_RATIO_RECORD] = low_ratio_record
    kernel_code = bind(tree, tuple(entries), stand_ins, {})
    common = backend_stand_ins(kernel_code.functions[KERNEL_ENTRY])
    hip_metadata_class = None
    if defines(tree, HIP_BACKEND_FILE, METADATA_CLASS):
        hip_stand_ins = dict(common)
        if defines(tree, HIP_BACKEND_FILE, UNIFIED_RECORD):
            unified = ClassCode(HIP_BACKEND_FILE, UNIFIED_RECORD, dataclass_fields=True)
            hip_stand_ins[UNIFIED_RECORD] = bind(tree, (unified,), {}, {}).classes[UNIFIED_RECORD].build(object)
        if defines(tree, HIP_GLUE_FILE, HIP_LOW_RATIO):
            glue = bind(tree, (FunctionCode(HIP_GLUE_FILE, HIP_LOW_RATIO),), triton_stand_ins(tree, HIP_GLUE_FILE), {})
            hip_stand_ins[HIP_LOW_RATIO] = glue.functions[HIP_LOW_RATIO]
        hip_metadata_class = metadata_class(tree, HIP_BACKEND_FILE, hip_stand_ins)
    return CompressionMetadataCode(
        kernel_code.label, kernel_file, kernel_code.functions[KERNEL_ENTRY],
        metadata_class(tree, CUDA_BACKEND_FILE, common), kernel_code.functions.get(LOW_RATIO_ENTRY), hip_metadata_class,
    )


def backend_stand_ins(kernel: Callable[..., tuple]) -> dict[str, Any]:
    """The globals a backend file's metadata methods read, ``kernel`` being the bound
    kernel entry its ``init_compression_metadata`` calls."""
    return {"_init_compression_metadata_triton": kernel, "F": torch.nn.functional, "torch": torch}


def metadata_class(tree: SourceTree, path: str, stand_ins: dict[str, Any],
                    methods: tuple[str, ...] = ("init_compression_metadata",)) -> type:
    """``path``'s ``DSV4AttnMetadata`` rebuilt from its fields, with ``methods``."""
    code = (FunctionCode(UTILS_FILE, "ceil_align"),
            ClassCode(path, METADATA_CLASS, methods=methods, if_defined=("has_c4", "has_c128"), dataclass_fields=True))
    return bind(tree, code, stand_ins, {}).classes[METADATA_CLASS].build(object)


@dataclass(frozen=True)
class CompressionBatch:
    """One forward's rows, as the compression metadata is built from them."""

    positions: torch.Tensor  # int64 per row; a row's causal length is its position + 1
    out_loc: torch.Tensor  # int64 per write row (the first rows), its full-pool location
    req_slots: torch.Tensor  # int64 per row
    req_to_token: torch.Tensor  # int32 [request slots, columns]
    mapping: torch.Tensor  # int64 full slot -> SWA slot, ending in -1 (what a free entry, -1, reads)
    page_size: int = PAGE_SIZE
    unified_swa_pages: int = 0  # the HIP unified-KV SWA region's size (0: no unified layout)

    @property
    def max_seq_len(self) -> int:
        return int(self.positions.max()) + 1

    @property
    def pages(self) -> torch.Tensor:
        return truth.page_table(self.req_to_token, self.req_slots, self.max_seq_len, self.page_size)

    @property
    def swa_page_indices(self) -> torch.Tensor:
        return truth.swa_page_indices(self.req_to_token, self.mapping, self.req_slots, self.positions)

    def expected(self) -> dict[str, torch.Tensor]:
        """Every value the kernel or the metadata holds for this batch, from the truth."""
        values = vars(truth.compression_metadata(self.positions, self.out_loc, self.pages, self.page_size)).copy()
        values["swa_page_indices"] = self.swa_page_indices
        values["c128_page_indices_padded"] = truth.c128_page_indices(self.pages, self.positions, self.page_size)
        for ratio in truth.LOW_RATIOS:
            values[f"c{ratio}_out_loc"] = truth.low_ratio_out_loc(self.positions, self.out_loc, ratio)
            values[f"c{ratio}_lengths_clamp1"] = truth.compressed_lengths(self.positions, ratio).clamp1
            values[f"c{ratio}_sparse_lengths"] = truth.sparse_topk_lengths(self.positions, INDEX_TOPK, ratio)
        values["empty_sparse_page_indices"] = truth.empty_sparse_page_indices(self.positions.numel(), INDEX_TOPK)
        for ratio in truth.COMPRESS_RATIOS:
            values[f"unified_c{ratio}_out_loc"] = truth.unified_compressed_out_loc(
                self.positions, self.out_loc, ratio, self.unified_swa_pages)
        return values


def first_wrong_row(name: str, got: Any, want: torch.Tensor) -> str | None:
    """Where ``got`` differs from ``want`` (by value, row by row), named; None when equal."""
    if got is None:
        return f"{name}: SGLang leaves it unset, the truth has {want.shape[0]} rows"
    got = got.to(device="cpu", dtype=torch.int64)
    want = want.to(dtype=torch.int64)
    if got.shape != want.shape:
        return f"{name}: SGLang's has shape {tuple(got.shape)}, the truth's {tuple(want.shape)}"
    differs = (got != want).reshape(want.shape[0], -1).any(dim=1) if want.numel() else torch.zeros(0, dtype=torch.bool)
    if not bool(differs.any()):
        return None
    row = int(differs.nonzero()[0])
    return f"{name} row {row}: SGLang {got[row].tolist()}, the truth {want[row].tolist()}"


def check(code: CompressionMetadataCode, batch: CompressionBatch) -> list[str]:
    """The first wrong row of every value the kernel returns and the metadata keeps
    (empty when all match the truth)."""
    expected = batch.expected()
    positions = batch.positions.to(torch.int32)
    wrong = []
    # with the ratio-128 index table, and without it (a stage with no ratio-128 layer)
    for with_table, label in ((True, KERNEL_ENTRY), (False, f"{KERNEL_ENTRY} without the c128 table")):
        returned = code.kernel(positions + 1, positions, batch.out_loc, batch.pages, batch.page_size,
                               compute_page_indices=with_table)
        names = KERNEL_OUTPUTS if len(returned) == len(KERNEL_OUTPUTS) else tuple(
            n for n in KERNEL_OUTPUTS if n != "c128_lengths_raw")
        for name, value in zip(names, returned):
            if name == "c128_page_indices" and not with_table:
                if value is not None:
                    wrong.append(f"{label}: c128_page_indices: SGLang makes one, none was asked for")
                continue
            wrong.append(first_wrong_row(f"{label}: {name}", value, expected[name]))
    metadatas = [(METADATA_CLASS, code.metadata(batch))]
    if code.low_ratio is not None:
        buffers = code.low_ratio(positions + 1, batch.out_loc, INDEX_TOPK)
        wrong += [first_wrong_row(f"{LOW_RATIO_ENTRY}: {name}", getattr(buffers, name), expected[value])
                  for name, value in LOW_RATIO_OUTPUTS.items()]
        metadatas.append((f"{METADATA_CLASS} with {LOW_RATIO_ENTRY}'s buffers", code.metadata(batch, buffers)))
    if code.hip_metadata_class is not None:
        metadatas.append((HIP_METADATA, code.metadata(batch, hip=True)))
    for label, metadata in metadatas:
        for field, value in METADATA_FIELDS.items():
            if not hasattr(metadata, field):
                continue  # a field the release does not declare (the V4.1 ratios before 0.5.21)
            wrong.append(first_wrong_row(f"{label}.{field}", getattr(metadata, field), expected[value]))
    if code.hip_unified and batch.unified_swa_pages:
        unified = metadatas[-1][1].unified
        for ratio in truth.COMPRESS_RATIOS:
            name = f"c{ratio}_out_loc"
            wrong.append(first_wrong_row(f"{HIP_METADATA}.unified.{name}", getattr(unified, name, None),
                                         expected[f"unified_{name}"]))
    return [w for w in wrong if w is not None]


def generated_batches(count: int, seed: int = 0, max_rows: int = 12) -> list[CompressionBatch]:
    """``count`` batches of decode and verify rows whose lengths sit on and beside the
    ratio-4 and ratio-128 boundaries, some padded as a CUDA graph bucket pads (rows of
    length 1, request slot 0, location 0). Small on purpose: the interpreter runs a kernel
    row in milliseconds."""
    rng = random.Random(seed)
    return [generated_batch(rng, max_rows) for _ in range(count)]


def generated_batch(rng: random.Random, max_rows: int, tokens_per_request: int | None = None,
           padding: int | None = None) -> CompressionBatch:
    """One batch of :func:`generated_batches`: ``tokens_per_request`` consecutive rows per
    request (1, 2 or 4 when not given), then ``padding`` graph padding rows (0, 1 or 3 when
    not given)."""
    slots, columns = 8, 4 * PAGE_SIZE
    free = list(range(1, slots * columns + 1))
    rng.shuffle(free)
    req_to_token = torch.tensor(free[: slots * columns], dtype=torch.int64).reshape(slots, columns)
    # full slot 0 is the pool's dummy; like SGLang's, the mapping ends in -1, which a free
    # entry (-1) reads
    mapping = torch.full((slots * columns + 2,), truth.NO_SLOT, dtype=torch.int64)
    mapping[0] = 0
    mapping[1:-1] = torch.randperm(slots * columns, generator=torch.Generator().manual_seed(rng.getrandbits(32))) + 1
    near = [1, 2, 3, 4, 5, 127, 128, 129, 255, 256, 257, 383, 384, 385, 512, 640]
    if tokens_per_request is None:
        tokens_per_request = rng.choice([1, 1, 2, 4])
    positions, req_slots = [], []
    for slot in rng.sample(range(slots), rng.randint(1, min(slots, max(1, max_rows // tokens_per_request)))):
        length = rng.choice(near) if rng.random() < 0.7 else rng.randint(1, columns - tokens_per_request)
        positions += range(length - 1, length - 1 + tokens_per_request)
        req_slots += [slot] * tokens_per_request
    out_loc = [int(req_to_token[s, p]) for s, p in zip(req_slots, positions)]
    if padding is None:
        padding = rng.choice([0, 0, 1, 3])
    positions += [0] * padding
    req_slots += [0] * padding
    out_loc += [0] * padding
    return CompressionBatch(
        positions=torch.tensor(positions, dtype=torch.int64), out_loc=torch.tensor(out_loc, dtype=torch.int64),
        req_slots=torch.tensor(req_slots, dtype=torch.int64), req_to_token=req_to_token.int(), mapping=mapping,
        unified_swa_pages=rng.randint(1, 1 << 20),
    )


@dataclass(frozen=True)
class ReleaseCheck:
    """What checking one tree's compression metadata found."""

    label: str
    checked: bool  # False: the values were not checked (``reason`` says why)
    wrong: tuple[str, ...] = ()  # the first wrong row of each value, in the first batch with any
    batch: CompressionBatch | None = None  # that batch
    reason: str = ""
    absent: tuple[str, ...] = ()  # the kernels the tree does not have, so not checked

    @property
    def passed(self) -> bool:
        return self.checked and not self.wrong

    def summary(self) -> str:
        if not self.checked:
            return f"{self.label}: {self.reason}"
        absent = f" (no {', '.join(self.absent)} in this tree)" if self.absent else ""
        if not self.wrong:
            return f"{self.label}: compressed-KV values match the truth{absent}"
        return (f"{self.label}: compressed-KV values differ from the truth{absent}\n"
                + "\n".join(f"  {w}" for w in self.wrong))


def check_release(tree: SourceTree, batches: list[CompressionBatch] | None = None) -> ReleaseCheck:
    """Bind ``tree``'s compression metadata code and check it on ``batches`` (a few
    generated ones when not given), stopping at the first batch with a wrong value."""
    if not triton_available():
        return ReleaseCheck(tree.label, checked=False, reason=TRITON_MISSING)
    code = bind_compression_metadata(tree)
    absent = code.absent
    for batch in batches if batches is not None else generated_batches(4):
        wrong = check(code, batch)
        if wrong:
            return ReleaseCheck(code.label, checked=True, wrong=tuple(wrong), batch=batch, absent=absent)
    return ReleaseCheck(code.label, checked=True, absent=absent)


def main(argv: list[str] | None = None) -> int:
    """``python -m swafuzz.subjects.sglang.compressed [VERSION...]``: check each release's
    compression metadata (every cached release when none is named) and say what was found."""
    from ...names import EXIT_DIVERGENCE, EXIT_OK, EXIT_USAGE
    from .locate import SglangUnavailable, cached_releases, wheel

    versions = [v for word in (sys.argv[1:] if argv is None else argv) for v in word.split(",") if v]
    if any(v.startswith("-") for v in versions):
        print("usage: python -m swafuzz.subjects.sglang.compressed [VERSION...]", file=sys.stderr)
        return EXIT_USAGE
    if not triton_available():
        print(f"compressed-KV values {TRITON_MISSING}", file=sys.stderr)
        return EXIT_USAGE
    worst = EXIT_OK
    for version in versions or cached_releases():
        try:
            result = check_release(wheel(version))
        except (SglangUnavailable, BindError) as exc:
            print(f"sglang {version}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(result.summary())
        worst = max(worst, EXIT_OK if result.passed else EXIT_DIVERGENCE)
    return worst


if __name__ == "__main__":
    sys.exit(main())
