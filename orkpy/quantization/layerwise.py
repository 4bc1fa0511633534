"""The recipe's calibrated stages layer by layer, streamed: GPTQ's rounding and the static
activation ranges calibrated with one layer's float32 weights in memory, never the whole
model's float copy, each layer's linears written before the next layer is read.

The calibration chunks' hidden rows (:class:`orkpy.runtime.blocks.Stream`, 32 MB for 8 x 512
tokens of a 2048-wide model) flow through the source one layer at a time
(:class:`orkpy.runtime.blocks.Block`, the layer function of the whole forward pass, bit for bit).
For layer ``l``: its linears are read in float32; its Gram matrices (the C hooks of the block
pass) are collected a batch at a time (:func:`orkpy.quantization.gptq.gram_batches`, at most
``max_bytes`` of float64 matrices held; every batch but the last on a copy of the rows); the
last pass moves the rows on to layer ``l + 1`` and collects the activation statistics; each
linear is then rounded (GPTQ on its Gram matrix, else :func:`orkpy.quantize` as the streamed
path rounds) and handed on packed, in the forward pass's order, its float copy dropped. The head
comes last, its input statistics from the final rows, its weight read and rounded in blocks of
rows (:data:`HEAD_BLOCK_BYTES` of float32 at a time: a 151,936 x 2048 head is never held in
float32). What this computes equals the whole-model stages byte for byte: the same statistics
(tests/test_blocks.py), the same rounding calls per linear and per row.

``gptq_sequential``: GPTQ's Gram matrices come from the rows as the quantized layers before left
them (a second stream through each layer's dequantized GPTQ weights), the activation ranges
still from the float rows, as the whole-model sequential mode does.

AWQ (``awq``, :class:`orkpy.quantization.awq.LayerAwq`): each block's scales are searched on that
block's input Gram matrices, from one pass of the rows through the block as the scales of the
blocks before left it, and folded in before the block is read for rounding; when that one pass
held every Gram matrix GPTQ needs, they are scaled exactly (``diag(1/s) G diag(1/s)``). The same
pass moves the rows on (the scales do not change the block's float function) and keeps the
block's linear inputs (:data:`CAPTURE_BYTES` at most), whose statistics divided by the scales
are the scaled inputs' activation statistics: one pass a block. Over that size (or with the Gram
matrices in several passes) a second pass through the scaled block moves the rows and collects
the statistics. The model's float copy is never held and AWQ needs no pass of its own.

Progress: one bar over the layers (``layer i/n``, the stage, the time left). A run given a
``checkpoint`` folder (:class:`Checkpoint`) saves each finished layer (its packed linears, the
rows, the statistics so far) and a restarted run continues after the last one saved, to the
same bytes.
"""
from __future__ import annotations

import hashlib
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._io import progress_bar
from ..formats.source import Source
from ..formats.tiermap import OUTPUT
from ..kernels.packed import PackedWeight, pack
from ..kernels.quant import QuantizedTensor
from ..runtime import actcal
from ..runtime.blocks import Block, Stream, input_stats, layer_linears, row_blocks
from ..runtime.linear import LinearSpec
from ..runtime.model import calib_chunks
from .gptq import DEFAULT_BLOCK, DEFAULT_DAMP, SHARED_INPUT, gptq_quantize, gram_batches
from .recipe import Recipe

if TYPE_CHECKING:
    from .awq import LayerAwq
    from .imatrix import Imatrix
    from .rounding import LinearPlan, Rounded, RunOptions

#: a streamed run's checkpoint folder: the output folder's name plus this
CHECKPOINT_SUFFIX = ".orkpy-checkpoint"
#: float64 Gram matrices held at once per layer (a batch per pass over the rows) when no
#: ``max_bytes`` is given: at least this, and up to twice the layer's largest Gram matrix -- what
#: GPTQ holds anyway while it factors that one (the matrix and its factor), so one pass over the
#: rows collects them all (Qwen3-1.7B: 400 MB, one pass a layer rather than two)
GRAM_BYTES = 256 << 20
#: float32 bytes of a block's linear inputs an AWQ run keeps from its Gram pass (one copy per distinct
#: input, every calibration row): within it that pass also moves the rows on and the activation
#: statistics come from the kept inputs divided by the scales, one pass a block instead of two
#: (Qwen3-1.7B, 8 x 512 tokens: 201 MB; 4B: 310 MB; 8B: 403 MB, over it: two passes, less memory)
CAPTURE_BYTES = 320 << 20
#: float32 bytes of a weight read at once: a larger one (a vocabulary-sized head) is read,
#: rounded and packed in blocks of rows
HEAD_BLOCK_BYTES = 64 << 20


def _owner(name: str) -> str:
    """The linear whose Gram matrix ``name`` shares (its input's first reader)."""
    parts = name.split(".")
    if len(parts) == 4 and parts[2] in SHARED_INPUT:
        return ".".join(parts[:2] + [SHARED_INPUT[parts[2]]] + parts[3:])
    return name


def _concat(parts: List[QuantizedTensor]) -> QuantizedTensor:
    """Row blocks of one weight, rounded apart (rows never interact), as one QuantizedTensor."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    N = sum(p.shape[0] for p in parts)
    offs = None if first.offsets is None else np.concatenate([p.offsets for p in parts if p.offsets is not None])
    return QuantizedTensor(kind=first.kind, shape=(N, first.shape[1]), codes=np.concatenate([p.codes for p in parts]),
                           scales=np.concatenate([p.scales for p in parts]), lut=first.lut, group=first.group,
                           offsets=offs)


class LayerwiseRun:
    """The layer-by-layer stages of one quantization (see module doc): iterate it for the
    rounded linears in the forward pass's order (:class:`orkpy.quantization.pipeline.Rounded`);
    :attr:`act_calibration` then holds the static activation ranges (None when not asked)."""

    def __init__(self, src: Source, plan: Dict[str, "LinearPlan"], recipe: Recipe, calib: Union[str, ArrayLike],
                 imatrix: Optional["Imatrix"], columns: Dict[str, NDArray[Any]], run: "RunOptions",
                 gptq: bool, acts: bool, checkpoint: Optional[str] = None,
                 max_bytes: Optional[int] = None, awq: Optional["LayerAwq"] = None) -> None:
        self.src, self.plan, self.recipe, self.run = src, plan, recipe, run
        self.imatrix, self.columns = imatrix, dict(columns)
        self.awq = awq
        self.gptq, self.acts = bool(gptq), bool(acts)
        self.sequential = self.gptq and bool(recipe.rounding.gptq_sequential)
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        c = recipe.calibration
        self.chunks, self.tokens = calib_chunks(src, calib, c.ctx, c.chunks)
        if awq is not None:  # the manifest records the chunks the scales were searched on
            awq.chunks = len(self.chunks)
        self.checkpoint = None if checkpoint is None else Checkpoint(
            checkpoint, checkpoint_key(src, recipe, self.tokens, plan, imatrix), run.log)
        prefix = recipe.activation.prefix
        self.prefix = actcal.DEFAULT_PREFIX if prefix is None else int(prefix)
        self.act_stats: Dict[str, Dict[str, Any]] = {}
        self.act_calibration: Optional[actcal.ActCalibration] = None
        self.timings: Dict[str, float] = {}
        self._deq: Dict[str, NDArray[np.float32]] = {}  # sequential GPTQ: the layer's dequantized weights

    # -- the stages of one layer --
    def _timed(self, stage: str, t0: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - t0

    def __iter__(self) -> Iterator["Rounded"]:
        from .rounding import Rounded
        src, n_layer = self.src, int(self.src.hp["n_layer"])
        bar = progress_bar(n_layer + 1, "recipe", self.run.progress, "layer")
        start = 0
        stream: Optional[Stream] = None
        qstream: Optional[Stream] = None
        if self.checkpoint is not None:
            got = self.checkpoint.load()
            if got is not None and self.awq is not None:
                try:
                    self._awq_resume(got[0])
                except (OSError, ValueError, KeyError) as e:
                    self.run.log(f"{self.checkpoint.path}: the checkpoint's AWQ scales are unreadable ({e}): started over")
                    got = None
            if got is not None:
                start, stream, qstream, self.act_stats = got
                for layer in range(start):  # the saved layers, one file at a time
                    for name, tier, pw in self.checkpoint.layer(layer):
                        yield Rounded(name, tier, pw, False)
                if bar is not None:
                    bar.update(start)
        try:
            t0 = time.perf_counter()
            if stream is None:
                stream = Stream(src, self.chunks)
                qstream = stream.copy() if self.sequential else None
            self._timed("embed", t0)
            last: Optional[Block] = None
            for layer in range(start, n_layer):
                if bar is not None:
                    bar.set_postfix(layer=f"{layer + 1}/{n_layer}", stage="calibrate")
                out: List[Rounded] = []
                last = None  # the block before (its float32 weights) goes before this one is read
                last = yield from self._layer(layer, stream, qstream, out, bar)
                if self.checkpoint is not None:
                    self.checkpoint.save(layer + 1, stream, qstream, self.act_stats, out,
                                         None if self.awq is None else self.awq.scales,
                                         None if self.awq is None else self.awq.report["alpha"])
                if bar is not None:
                    bar.update(1)
            if bar is not None:
                bar.set_postfix(layer="head", stage="calibrate")
            yield from self._head(last, stream, qstream, n_layer)
            if bar is not None:
                bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        if self.acts:
            t0 = time.perf_counter()
            self.act_calibration = actcal.from_stats(self.act_stats, self._act_info())
            self._timed("act ranges", t0)

    def finished(self) -> None:
        """The result is safe (its model directory in place): the checkpoint goes."""
        if self.checkpoint is not None:
            self.checkpoint.remove()

    def _specs(self, layer: int) -> Dict[str, LinearSpec]:
        t0 = time.perf_counter()
        specs = {}
        for n in layer_linears(layer):
            specs[n] = LinearSpec.f32(n, self.src.linear(n))
            self.src.release(caches=False)  # the file's pages of this linear: read, not kept in memory
        self._timed("read", t0)
        return specs

    def _layer(self, layer: int, stream: Stream, qstream: Optional[Stream], out: List["Rounded"],
               bar: Any) -> Generator["Rounded", None, Block]:
        """Calibrate and round layer ``layer`` (a generator of its Rounded linears; returns its
        float Block, which the head's statistics use after the last layer)."""
        names = layer_linears(layer)
        packed = [n for n in names if self.plan[n].kind != "gguf"]
        owners: List[str] = []
        if self.gptq:
            for n in packed:
                o = _owner(n)
                if o not in owners:
                    owners.append(o)
        threads = self.run.threads
        scaled, moved = self._awq_layer(layer, stream, owners) if self.awq is not None else (None, False)
        specs = self._specs(layer)
        blk = Block(self.src, layer, specs)
        done: Set[str] = set()
        if scaled is not None or moved:  # AWQ's pass held every Gram matrix, or moved the rows on, or both
            if not moved:
                t0 = time.perf_counter()
                got = blk.run(stream, threads, act_prefix=self.prefix if self.acts else None)
                self.act_stats.update(got.get("acts", {}))
                self._timed("forward", t0)
            yield from self._round(names, specs, scaled or {}, done, out, until=None)
            self.src.release()
            return blk
        batches = gram_batches(owners, lambda n: specs[n].K, self._gram_limit(specs, owners)) if owners else []
        grams: Dict[str, Any] = {}
        if not self.sequential:  # every batch on the float rows; the last one moves them on
            if not batches:
                t0 = time.perf_counter()
                got = blk.run(stream, threads, act_prefix=self.prefix if self.acts else None)
                self.act_stats.update(got.get("acts", {}))
                self._timed("forward", t0)
            for bi, batch in enumerate(batches):
                t0 = time.perf_counter()
                final = bi == len(batches) - 1
                got = blk.run(stream, threads, grams=batch, act_prefix=self.prefix if (final and self.acts) else None,
                              advance=final)
                self.act_stats.update(got.get("acts", {}))
                grams = got["grams"]
                self._timed("forward+gram", t0)
                if bar is not None:
                    bar.set_postfix(layer=f"{layer + 1}/{int(self.src.hp['n_layer'])}", stage="round")
                yield from self._round(names, specs, grams, done, out, until=batch[-1])
                grams = {}
        else:  # GPTQ's inputs from the quantized rows; the activation ranges from the float ones
            assert qstream is not None
            for batch in batches:
                t0 = time.perf_counter()
                grams = blk.run(qstream, threads, grams=batch, advance=False)["grams"]
                self._timed("forward+gram", t0)
                yield from self._round(names, specs, grams, done, out, until=batch[-1])
            t0 = time.perf_counter()
            got = blk.run(stream, threads, act_prefix=self.prefix if self.acts else None)
            self.act_stats.update(got.get("acts", {}))
            qspecs = {n: (LinearSpec.f32(n, self._deq[n]) if n in self._deq else specs[n]) for n in names}
            Block(self.src, layer, qspecs).run(qstream, threads)
            self._deq = {}
            self._timed("forward", t0)
        yield from self._round(names, specs, {}, done, out, until=None)
        self.src.release()
        return blk

    def _gram_limit(self, specs: Mapping[str, LinearSpec], names: Sequence[str]) -> int:
        """Bytes of Gram matrices one pass over a block's rows may hold: ``max_bytes``, else
        :data:`GRAM_BYTES` or twice the largest of ``names``' (what GPTQ holds anyway)."""
        if self.max_bytes is not None:
            return self.max_bytes
        return max([GRAM_BYTES] + [2 * 8 * specs[n].K ** 2 for n in names])

    def _awq_layer(self, layer: int, stream: Stream, owners: List[str]) -> Tuple[Optional[Dict[str, Any]], bool]:
        """AWQ's scales of block ``layer`` searched on its inputs (a pass of the rows through the
        block) and folded into :attr:`src`. Returns (GPTQ's Gram matrices of the scaled inputs when
        that one pass held all of them, else None; whether that pass also moved the rows on and
        gave the activation statistics, from the block's inputs it kept, at most
        :data:`CAPTURE_BYTES`, divided by the scales). The block's own passes give what it did not."""
        assert self.awq is not None
        inputs = self.awq.inputs(layer)
        if not inputs:
            return None, False
        specs = self._specs(layer)
        blk = Block(self.src, layer, specs)
        names = layer_linears(layer)
        need = [n for n in names if n in set(owners) | set(inputs)]
        batches = gram_batches(need, lambda n: specs[n].K, self._gram_limit(specs, need))
        single = len(batches) == 1 and not self.sequential
        keep = single and self.gptq
        kept: Dict[str, Any] = {}
        capture = sorted({_owner(n) for n in names}, key=names.index) if self.acts else []
        rows = sum(int(x.shape[0]) for x in stream.xs)
        move = single and 4 * rows * sum(specs[n].K for n in capture) <= CAPTURE_BYTES
        captured: Dict[str, NDArray[np.float32]] = {}
        for bi, batch in enumerate(batches):
            t0 = time.perf_counter()
            got = blk.run(stream, self.run.threads, grams=batch, advance=move, capture=capture if move else ())
            grams, captured = got["grams"], got.get("inputs", {})
            del got
            self._timed("forward+gram", t0)
            t0 = time.perf_counter()
            last = bi == len(batches) - 1
            if last:  # the passes are done: the weights go group by group as they are searched
                del blk
                self.src.release()
            for _, lins, inp in self.awq.groups(layer):
                if inp not in grams:
                    continue
                weights = {n: (specs.pop(n) if last else specs[n]).weight for n in lins}
                assert all(w is not None for w in weights.values())  # read in float32 by _specs
                self.awq.search(layer, weights, {inp: grams[inp]}, self.run.threads)  # type: ignore[arg-type]
                del weights
            self._timed("awq search", t0)
            if keep:
                kept = grams
            del grams
        del specs
        self.src = self.awq.source()
        self.columns.update(self.awq.columns(layer))
        if captured:  # the scaled inputs' statistics: each captured input divided by its readers' scales
            t0 = time.perf_counter()
            calls = [int(x.shape[0]) for x in stream.xs]
            cols = self.awq.columns(layer)
            for n in names:
                self.act_stats[n] = input_stats(captured[_owner(n)], calls, self.prefix, cols.get(n))
            del captured
            self._timed("act stats", t0)
        if not keep:
            return None, move
        self.awq.scale_grams(layer, kept)
        return kept, move

    def _awq_resume(self, start: int) -> None:
        """The scales of the ``start`` saved blocks folded in (a resumed run)."""
        assert self.awq is not None and self.checkpoint is not None
        scales, alphas = self.checkpoint.awq()
        self.awq.scales.update(scales)
        self.awq.report["alpha"].update(alphas)
        self.src = self.awq.source()
        for layer in range(start):
            self.columns.update(self.awq.columns(layer))

    def _round(self, names: Sequence[str], specs: Dict[str, LinearSpec], grams: Dict[str, Any], done: set,
               out: List["Rounded"], until: Optional[str]) -> Iterator["Rounded"]:
        """Round the layer's linears in order, up to and including the readers of ``until``'s
        Gram matrix (all the rest with None)."""
        from .rounding import Rounded, importance, round_linear, symmetric_for
        for n in names:
            if n in done:
                continue
            if until is not None and _owner(n) not in grams:
                break
            p = self.plan[n]
            done.add(n)
            if p.kind == "gguf":
                r = Rounded(n, p.tier, None, False)
            else:
                t0 = time.perf_counter()
                w = specs[n].weight
                assert w is not None
                if self.gptq:
                    o = _owner(n)
                    g, rows = grams[o]
                    # its last reader factors in the Gram matrix's own memory (one K x K float64 less)
                    last = not any(_owner(m) == o and m not in done and self.plan[m].kind != "gguf" for m in names)
                    q = gptq_quantize(w, g, p.kind, DEFAULT_DAMP, DEFAULT_BLOCK, where=n, rows=rows,
                                      group_size=p.group or 0, threads=self.run.threads, overwrite_gram=last,
                                      precision=self.recipe.rounding.gptq_precision,
                                      symmetric=symmetric_for(p.kind, p.group, w.shape[1], self.recipe.rounding))
                    if last:
                        del g, grams[o]
                    if self.sequential:
                        self._deq[n] = q.dequantize()
                else:
                    q = round_linear(w, p, self.recipe.rounding,
                                     importance(self.imatrix, n, self.columns.get(n), w.shape[1]), self.run.threads)
                r = Rounded(n, p.tier, pack(q), True)
                del q
                self._timed("gptq" if self.gptq else "round", t0)
            out.append(r)
            yield r

    def _head(self, last: Optional[Block], stream: Stream, qstream: Optional[Stream], n_layer: int
              ) -> Iterator["Rounded"]:
        """The head: its input statistics from the final rows, its weight rounded in row blocks."""
        from .rounding import Rounded, importance, round_linear, symmetric_for
        p = self.plan.get(OUTPUT)
        want_gram = self.gptq and p is not None and p.kind != "gguf"
        if last is None or (last.layer != n_layer - 1):  # resumed after the last layer: one block to run the head
            last = Block(self.src, n_layer - 1, self._specs(n_layer - 1))
        t0 = time.perf_counter()
        if self.acts:
            self.act_stats.update(last.head_stats(stream, self.run.threads, act_prefix=self.prefix)["acts"])
        gram = None
        if want_gram:
            src_rows = qstream if (self.sequential and qstream is not None) else stream
            gram = last.head_stats(src_rows, self.run.threads, gram=True)["grams"][OUTPUT]
        self._timed("forward+gram", t0)
        del last
        if p is None:
            return
        if p.kind == "gguf":
            yield Rounded(OUTPUT, p.tier, None, False)
            return
        t0 = time.perf_counter()
        N, K = self.src.shapes()[self.src.tensor_name(OUTPUT)][:2]
        parts = []
        for rows in row_blocks(N, K, HEAD_BLOCK_BYTES):
            w = self.src.rows(OUTPUT, rows)
            if gram is not None:
                parts.append(gptq_quantize(w, gram[0], p.kind, DEFAULT_DAMP, DEFAULT_BLOCK, where=OUTPUT,
                                           rows=gram[1], group_size=p.group or 0, threads=self.run.threads,
                                           precision=self.recipe.rounding.gptq_precision,
                                           symmetric=symmetric_for(p.kind, p.group, K, self.recipe.rounding)))
            else:
                parts.append(round_linear(w, p, self.recipe.rounding,
                                          importance(self.imatrix, OUTPUT, self.columns.get(OUTPUT), K),
                                          self.run.threads))
            del w
            self.src.release(caches=False)
        pw = pack(_concat(parts))
        del parts
        self._timed("gptq" if gram is not None else "round", t0)
        yield Rounded(OUTPUT, p.tier, pw, True)

    def _act_info(self) -> Dict[str, Any]:
        """The calibration's description, as :func:`orkpy.runtime.actcal.calibrate_activations` records it."""
        c = self.recipe.calibration
        n_chunk = len(self.chunks)
        return {"model": os.path.basename(str(self.src.path)), "n_ctx": int(c.ctx), "chunks": int(n_chunk),
                "tokens_sha256": hashlib.sha256(np.asarray(self.tokens[: n_chunk * c.ctx], np.int32).tobytes()
                                                ).hexdigest(),
                "prefix": self.prefix,
                "grid": {"per_octave": actcal.GRID_PER_OCTAVE, "octaves": actcal.GRID_OCTAVES}}


class Checkpoint:
    """A resumable run's saved layers: the folder ``path`` (orkpy's own: a ``CHECKPOINT`` marker
    file) holds, per finished layer, its packed linears (``layer-<i>.npz``), and the rows and the
    activation statistics after the last finished layer (``rows.npz``, ``acts.npz``), then
    ``state.json`` (``key``, ``layers``), each written atomically, state last. ``key`` is a hash
    of everything the result depends on (the recipe, the source's name, size and modification
    time, the calibration tokens, the tiers, the imatrix): a folder made for other inputs is
    not resumed but started over. :meth:`remove` deletes it when the run is done."""

    MARKER = "CHECKPOINT"

    def __init__(self, path: str, key: str, log: Callable[[str], None]) -> None:
        self.path, self.key, self.log = os.path.abspath(path), key, log

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def load(self) -> Optional[tuple]:
        """(layers done, float rows, quantized rows or None, activation statistics) of a matching
        saved run (every layer file read and checked; :meth:`layer` gives each layer's linears),
        or None (nothing saved, another run's folder, an unreadable one: then started over)."""
        import json
        try:
            with open(self._file("state.json"), "rb") as f:
                state = json.loads(f.read())
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict) or state.get("key") != self.key or not isinstance(state.get("layers"), int):
            self.log(f"{self.path}: a checkpoint of other inputs: started over")
            return None
        k = state["layers"]
        n_linears = 0
        try:
            for layer in range(k):
                n_linears += len(self.layer(layer))  # each file read and checked now; kept one at a time later
            with np.load(self._file("rows.npz"), allow_pickle=False) as z:
                if int(z["layer"]) != k:
                    raise ValueError("rows of another layer")
                stream = Stream.__new__(Stream)
                stream.xs, stream.layer = [np.array(x) for x in z["xs"]], k
                qstream = None
                if "qxs" in z:
                    qstream = Stream.__new__(Stream)
                    qstream.xs, qstream.layer = [np.array(x) for x in z["qxs"]], k
            acts = _load_acts(self._file("acts.npz"))
        except (OSError, ValueError, KeyError) as e:
            self.log(f"{self.path}: the checkpoint is unreadable ({e}): started over")
            return None
        self.log(f"{self.path}: resumed after layer {k} ({n_linears} linears saved)")
        return k, stream, qstream, acts

    def layer(self, layer: int) -> List[tuple]:
        """[(name, tier, PackedWeight or None)] of saved layer ``layer``."""
        import json
        out = []
        with np.load(self._file(f"layer-{layer}.npz"), allow_pickle=False) as z:
            for e in json.loads(bytes(z["meta"]).decode()):
                off = z[e["name"] + "/boffset"] if e["name"] + "/boffset" in z.files else None  # affine groups
                pw = None if e["kind"] is None else PackedWeight(
                    e["kind"], tuple(e["shape"]), np.array(z[e["name"] + "/store"]),
                    np.array(z[e["name"] + "/bscale"]), group=e["group"] or None,
                    boffset=None if off is None else np.array(off))
                out.append((e["name"], e["tier"], pw))
        return out

    def awq(self) -> tuple:
        """({scale key: s}, {scale key: alpha}) of the saved blocks' AWQ scales."""
        with np.load(self._file("awq.npz"), allow_pickle=False) as z:
            alphas = {k[:-len("/alpha")]: float(z[k]) for k in z.files if k.endswith("/alpha")}
            return {k: np.array(z[k]) for k in z.files if not k.endswith("/alpha")}, alphas

    def save(self, layers: int, stream: Stream, qstream: Optional[Stream], acts: Dict[str, Dict[str, Any]],
             rounded: Sequence["Rounded"], awq: Optional[Dict[str, NDArray[np.float64]]] = None,
             alphas: Optional[Dict[str, float]] = None) -> None:
        """Record layer ``layers - 1`` finished: its linears, the rows entering layer ``layers``
        (and the AWQ scales so far, ``awq``, with their ``alphas``)."""
        import json
        from .._io import atomic_write
        if not os.path.isdir(self.path):
            os.makedirs(self.path, exist_ok=True)
            atomic_write(self._file(self.MARKER), [b"orkpy quantization checkpoint\n"])
        arrays: Dict[str, Any] = {}
        meta = []
        for r in rounded:
            pw = r.packed
            meta.append({"name": r.name, "tier": r.tier, "kind": None if pw is None else pw.kind,
                         "shape": None if pw is None else list(pw.shape), "group": None if pw is None else pw.group})
            if pw is not None:
                arrays[r.name + "/store"] = np.asarray(pw.store)
                arrays[r.name + "/bscale"] = np.asarray(pw.bscale)
                if pw.boffset is not None:
                    arrays[r.name + "/boffset"] = np.asarray(pw.boffset)
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        _save_npz(self._file(f"layer-{layers - 1}.npz"), arrays)
        rows: Dict[str, Any] = {"layer": np.int64(layers), "xs": np.stack(stream.xs)}
        if qstream is not None:
            rows["qxs"] = np.stack(qstream.xs)
        _save_npz(self._file("rows.npz"), rows)
        _save_acts(self._file("acts.npz"), acts)
        if awq is not None:
            _save_npz(self._file("awq.npz"), {**{k: np.asarray(v) for k, v in awq.items()},
                                              **{k + "/alpha": np.float64(a) for k, a in (alphas or {}).items()}})
        atomic_write(self._file("state.json"), [json.dumps({"key": self.key, "layers": layers}).encode()])

    def remove(self) -> None:
        """Delete the folder (only a checkpoint folder: it holds the marker)."""
        import shutil
        if os.path.isfile(self._file(self.MARKER)):
            shutil.rmtree(self.path, ignore_errors=True)


def _save_npz(path: str, arrays: Dict[str, Any]) -> None:
    import io
    from .._io import atomic_write
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write(path, [buf.getbuffer()])


def _save_acts(path: str, acts: Dict[str, Dict[str, Any]]) -> None:
    """Activation statistics ({linear: {key: number or array}}) as one npz of ``<linear>/<key>`` arrays."""
    _save_npz(path, {f"{n}/{k}": np.asarray(v) for n, d in acts.items() for k, v in d.items()})


def _load_acts(path: str) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    with np.load(path, allow_pickle=False) as z:
        for key in z.files:
            n, k = key.rsplit("/", 1)
            a = np.array(z[key])
            out.setdefault(n, {})[k] = a if a.ndim else a[()]
    return out


def checkpoint_key(src: Source, recipe: Recipe, tokens: NDArray[np.int32], plan: Dict[str, "LinearPlan"],
                   imatrix: Optional["Imatrix"]) -> str:
    """What a checkpoint's result depends on, hashed (see :class:`Checkpoint`)."""
    import json
    st = os.stat(src.path)
    h = hashlib.sha256()
    h.update(json.dumps({"source": [os.path.abspath(src.path), st.st_size, st.st_mtime_ns],
                         "recipe": recipe.to_dict(), "tiers": {n: list(p) for n, p in plan.items()},
                         "imatrix": None if imatrix is None else imatrix.sha256(),
                         "transform": src.info() if hasattr(src, "info") else None}, sort_keys=True,
                        default=str).encode())
    h.update(np.asarray(tokens, np.int32).tobytes())
    return h.hexdigest()


__all__ = ["CHECKPOINT_SUFFIX", "Checkpoint", "GRAM_BYTES", "HEAD_BLOCK_BYTES", "LayerwiseRun", "checkpoint_key"]
