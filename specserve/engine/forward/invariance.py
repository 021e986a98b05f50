"""The invariance probe: whether this machine's kernels make a forward row-invariant for a model
(each linear's row i of an M-row product equals the 1-row product; the position-invariant
attention gives one result per prefix), and `apply`, which switches a model to it when they do.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from pydantic import BaseModel

from specserve.engine import hf_internals, kernels, row_tiles
from specserve.engine.hf_internals import invariant_plan

# the row counts a forward may have: 1..16 and the batched / prefill widths up to a 512 chunk
PROBED_ROWS = (*range(1, 18), 24, 31, 32, 33, 48, 63, 64, 65, 96, 128, 192, 256, 320, 384, 512)
# row tiles tried where a linear is not row-invariant to PROBED_ROWS[-1] (4: a Zen 4's bf16
# 1536 -> 576 product changes path above 5 rows)
TILES = (32, 16, 8, 4)


class RowTiles(BaseModel):
    """How a model's linears run row-invariant: products of fewer than `pad` rows padded with
    zero rows to `pad`, longer ones in tiles of at most `tile` rows (None: one product; 0: no
    tiling helps), except the shapes in `untiled` (invariant at any rows), left alone."""

    pad: int = 1
    tile: int | None = None
    untiled: tuple[tuple[int, int], ...] = ()


class InvarianceReport(BaseModel):
    """What the probe found for one model's shapes on this device, dtype and torch."""

    invariant: bool
    reason: str
    dtype: str
    device: str
    torch: str
    threads: int
    tiles: RowTiles | None = None  # how the linears run row-invariant (None: not invariant)


def probe(model) -> InvarianceReport:
    """The report for `model` (cached per shapes, dtype, device, threads and torch)."""
    config = model.config
    linears = tuple(
        sorted(
            {
                (m.in_features, m.out_features)
                for m in model.modules()
                if isinstance(m, torch.nn.Linear)
            }
        )
    )
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return _probe(
        linears,
        (heads, kv_heads, head_dim),
        bool(any(hf_internals.layer_windows(config))),
        str(model.dtype),
        model.device.type,
        torch.get_num_threads(),
        torch.__version__,
    )


@functools.cache
def _probe(linears, attention, windowed, dtype, device, threads, version):
    dt = getattr(torch, dtype.removeprefix("torch."))
    where = {"dtype": dtype, "device": device, "torch": version, "threads": threads}
    if device != "cpu":
        return InvarianceReport(invariant=False, reason=f"not probed on {device}", **where)
    if windowed:
        reason = "sliding-window layers: the invariant attention covers full attention only"
        return InvarianceReport(invariant=False, reason=reason, **where)
    tiles = row_tile(linears, dt)
    if tiles.tile == 0:
        worst = next(s for s in linears if first_variant_rows(*s, dt, _upto(TILES[-1]), 2))
        reason = f"{dtype} F.linear {worst[0]}->{worst[1]} is not row-invariant here, even in tiles"
        return InvarianceReport(invariant=False, reason=reason, **where)
    try:
        kernels.tail_kernel()
    except kernels.KernelUnavailable as unavailable:
        reason = f"no tail-attention kernel here: {unavailable}"
        return InvarianceReport(invariant=False, reason=reason, **where)
    if not attention_invariant(*attention, dt):
        reason = f"{dtype} position-invariant attention differs between layouts here"
        return InvarianceReport(invariant=False, reason=reason, **where)
    reason = (
        f"{dtype} linears row-invariant {_how(tiles, len(linears))}; attention invariant to layout"
    )
    return InvarianceReport(invariant=True, reason=reason, tiles=tiles, **where)


def _how(tiles: RowTiles, shapes: int) -> str:
    """Example: "with 1-row products padded to 2 (1 of 5 shapes; the rest as they are)"."""
    if tiles.pad == 1 and tiles.tile is None:
        return f"to {PROBED_ROWS[-1]} rows"
    how = [f"with 1-row products padded to {tiles.pad}"] if tiles.pad > 1 else []
    how += [f"in row tiles of {tiles.tile}"] if tiles.tile else []
    done = shapes - len(tiles.untiled)
    return " and ".join(how) + f" ({done} of {shapes} shapes; the rest as they are)"


def row_tile(linears, dtype) -> RowTiles:
    """The cheapest `RowTiles` under which every shape is row-invariant at PROBED_ROWS: no tiles;
    else 1-row products padded to 2 (a Zen 4's bf16 1-row product takes its own path, while
    every product of 2+ rows equals the padded 2-row one); else the largest of TILES, unpadded
    then padded. The shapes invariant unpadded at any rows stay untiled.

    Example: 576 -> 576 invariant everywhere, 1536 -> 576 invariant once padded to 2 ->
    RowTiles(pad=2, untiled=((576, 576),)).
    """
    untiled = tuple(s for s in linears if first_variant_rows(*s, dtype, PROBED_ROWS) is None)
    if len(untiled) == len(linears):
        return RowTiles()
    rest = [s for s in linears if s not in untiled]
    if all(first_variant_rows(*s, dtype, PROBED_ROWS, pad=2) is None for s in rest):
        return RowTiles(pad=2, untiled=untiled)
    for pad in (1, 2):
        for tile in TILES:
            if all(first_variant_rows(*s, dtype, _upto(tile), pad) is None for s in rest):
                return RowTiles(pad=pad, tile=tile, untiled=untiled)
    return RowTiles(tile=0)


def _upto(tile: int) -> tuple[int, ...]:
    return tuple(m for m in PROBED_ROWS if m <= tile)


def first_variant_rows(in_f: int, out_f: int, dtype, rows, pad: int = 1) -> int | None:
    """The first M in `rows` (those >= `pad`) for which some row of the M-row product differs
    from that row's product padded with zero rows to `pad` rows (every row checked), or None.
    Random data of this shape and dtype, inputs at two scales (x1 and x100: a kernel's path
    can depend on the values); the single products are computed once (cached per shape)."""
    for scale in SCALES:
        x, w, single = _singles(in_f, out_f, dtype, max(rows), pad, scale)
        for m in rows:
            if m >= pad and not torch.equal(F.linear(x[:m], w), single[:m]):
                return m
    return None


SCALES = (1.0, 100.0)


@functools.lru_cache(maxsize=64)
def _singles(in_f: int, out_f: int, dtype, top: int, pad: int, scale: float):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(out_f, in_f, generator=gen).to(dtype)
    x = (torch.randn(top, in_f, generator=gen) * scale).to(dtype)
    zeros = torch.zeros(pad - 1, in_f, dtype=dtype)
    return x, w, torch.cat([F.linear(torch.cat([x[i : i + 1], zeros]), w)[:1] for i in range(top)])


def attention_invariant(heads: int, kv_heads: int, head_dim: int, dtype) -> bool:
    """One query's output over one prefix in three layouts: decoding alone, a tree row whose
    ancestors sit after a masked sibling, and a batch row beside a longer row (False where the
    tail kernel does not build or take these shapes)."""
    try:
        return _same_in_three_layouts(heads, kv_heads, head_dim, dtype)
    except kernels.KernelUnavailable:
        return False


def _same_in_three_layouts(heads: int, kv_heads: int, head_dim: int, dtype) -> bool:
    gen = torch.Generator().manual_seed(0)
    length = 300  # positions 0..299; the query is position 299
    keys = torch.randn(1, kv_heads, length + 1, head_dim, generator=gen).to(dtype)
    values = torch.randn(1, kv_heads, length + 1, head_dim, generator=gen).to(dtype)
    query = torch.randn(1, heads, 1, head_dim, generator=gen).to(dtype)
    alone = _attend(query, keys[:, :, :length], values[:, :, :length], [[True] * length], [299])
    # tree: held 296, then [x(296), sibling(297), y(297), z(298), q(299)], sibling masked
    tree_k = torch.cat([keys[:, :, :297], keys[:, :, 300:], keys[:, :, 297:300]], dim=2)
    tree_v = torch.cat([values[:, :, :297], values[:, :, 300:], values[:, :, 297:300]], dim=2)
    seen = [True] * 297 + [False] + [True] * 3
    tree = _attend(query, tree_k, tree_v, [seen], [299])
    # batch: this row beside a row of 310 positions
    wide_k = torch.cat([keys, torch.randn(1, kv_heads, 301, head_dim, generator=gen).to(dtype)])
    wide_k = torch.cat([wide_k, torch.zeros(2, kv_heads, 10, head_dim, dtype=dtype)], dim=2)
    wide_v = torch.cat([values, torch.randn(1, kv_heads, 301, head_dim, generator=gen).to(dtype)])
    wide_v = torch.cat([wide_v, torch.zeros(2, kv_heads, 10, head_dim, dtype=dtype)], dim=2)
    queries = torch.cat([query, torch.randn(1, heads, 1, head_dim, generator=gen).to(dtype)])
    batch = _attend(
        queries, wide_k, wide_v, [[True] * 300 + [False] * 11, [True] * 311], [299, 310]
    )
    same = torch.equal(alone[0], tree[0]) and torch.equal(alone[0], batch[0])
    group = heads // kv_heads
    return (
        same
        and masked_tail_invariant(kv_heads, group, head_dim, dtype)
        and query_rows_invariant(kv_heads, group, head_dim, dtype)
    )


def query_rows_invariant(kv_heads: int, group: int, head_dim: int, dtype) -> bool:
    """Whether the flash kernel gives a query row the same output and log-sum-exp in calls of
    every padded row count the layouts make (`invariant_plan.padded_head_rows` for 1..12 queries and
    33), at short and long widths, queries at two scales (a Zen 4's blocks of 1-3 rows differed
    from larger ones only on some values)."""
    gen = torch.Generator().manual_seed(2)
    for width, scale in ((300, 1.0), (800, 1.0), (800, 10.0)):
        keys = torch.randn(1, kv_heads, width, head_dim, generator=gen).to(dtype)
        values = torch.randn(1, kv_heads, width, head_dim, generator=gen).to(dtype)
        query = (torch.randn(1, kv_heads, group * 33 + 4, head_dim, generator=gen) * scale).to(
            dtype
        )
        first = None
        for q in (*range(1, 13), 33):
            rows = invariant_plan.padded_head_rows(group, q)
            mask = torch.zeros(1, 1, rows, width, dtype=dtype)
            mask[..., width - 32 :] = float("-inf")
            out, lse = hf_internals.flash_attention(query[:, :, :rows], keys, values, mask)
            got = (out[:, :, :group], lse[:, :, :group])
            first = got if first is None else first
            if not (torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])):
                return False
    return True


def masked_tail_invariant(kv_heads: int, group: int, head_dim: int, dtype) -> bool:
    """Whether the flash kernel gives a query row over keys [0, S) the same output and
    log-sum-exp whatever masked tail follows (rows of many lengths share one padded call)."""
    gen = torch.Generator().manual_seed(1)
    keys = torch.randn(1, kv_heads, 1056, head_dim, generator=gen).to(dtype)
    values = torch.randn(1, kv_heads, 1056, head_dim, generator=gen).to(dtype)
    query = torch.randn(1, kv_heads, 2 * group, head_dim, generator=gen).to(dtype)
    for held in (64, 288):
        first = None
        for width in (held, held + 32, 544, 1056):
            mask = torch.zeros(1, 1, 2 * group, width, dtype=dtype)
            mask[..., held:] = float("-inf")
            out = hf_internals.flash_attention(
                query, keys[:, :, :width], values[:, :, :width], mask
            )
            first = out if first is None else first
            if not (torch.equal(out[0], first[0]) and torch.equal(out[1], first[1])):
                return False
    return True


def _attend(query, keys, values, seen: list[list[bool]], positions: list[int]) -> torch.Tensor:
    allowed = torch.tensor(seen)[:, None, :]  # [b, 1, columns]
    at = torch.tensor(positions)[:, None]  # [b, 1]
    group = query.shape[1] // keys.shape[1]
    lay = hf_internals.invariant_layout(allowed, at, group, query.dtype, query.device)
    return hf_internals.invariant_attention(None, query, keys, values, lay, None)


def apply(model, enabled: bool = True) -> InvarianceReport:
    """Probe `model` and, where invariant (and `enabled`), serve it with the position-invariant
    attention and its linears in the probe's row tiles; otherwise leave it as it is."""
    report = probe(model)
    if report.invariant and not enabled:
        report = report.model_copy(update={"invariant": False, "reason": "turned off"})
    if report.invariant:
        tiles = report.tiles
        needed = tiles.pad > 1 or tiles.tile is not None
        if needed and getattr(model, "row_plan", None) is None:
            tile = tiles.tile or row_tiles.WHOLE
            untiled = frozenset(tiles.untiled)
            row_tiles.tile_linears(model, tile, untiled, model.dtype, pad=tiles.pad)
        hf_internals.enable_invariant(model)
    return report
