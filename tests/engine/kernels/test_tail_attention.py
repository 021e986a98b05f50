"""The tail kernel (`kernels/tail_attention.c`): each query vector's softmax over its own tail keys
folded into its flash partial equals a slow float64 reference; a row's bits do not depend on the
rows beside it (block slots, shared runs, gathered rows, threads), for any query heads per kv
head; the build is cached and a missing compiler is reported."""

from __future__ import annotations

import ctypes
import random

import pytest
import torch

from specserve import paths
from specserve.engine import kernels
from specserve.engine.forward import invariance
from specserve.engine.hf_internals import invariant, invariant_plan
from specserve.env import EnvVar

KV_HEADS, D = 2, 32
GROUPS = (1, 2, 3, 4, 5)  # query heads per kv head: every block width the kernel picks, spares
MAX_SPAN = 256  # tail_attention.c: columns one run of rows converts at once


def _case(gen, dtype, tails: list[list[int]], columns: int, flash_keys: list[int], group=3):
    """One batch row, one query row per entry of `tails` (its tail columns, ascending) and of
    `flash_keys` (how many keys its flash partial covers, 0: none): query [1, H, q, d], keys and
    values [1, KVH, columns, d], the partials from a float64 reference over columns [0, n)."""
    q = len(tails)
    query = torch.randn(1, group * KV_HEADS, q, D, generator=gen).to(dtype)
    keys = torch.randn(1, KV_HEADS, columns, D, generator=gen).to(dtype)
    values = torch.randn(1, KV_HEADS, columns, D, generator=gen).to(dtype)
    rows = group * q  # head-major: row g q + i
    flash_out = torch.zeros(1, KV_HEADS, rows, D, dtype=dtype)
    flash_lse = torch.full((1, KV_HEADS, rows), -torch.inf)
    for i, n in enumerate(flash_keys):
        if not n:
            continue
        for h in range(KV_HEADS):
            for g in range(group):
                out, lse = _softmax(query[0, h * group + g, i], keys[0, h, :n], values[0, h, :n])
                flash_out[0, h, g * q + i], flash_lse[0, h, g * q + i] = out.to(dtype), lse
    return query, keys, values, flash_out, flash_lse


def _softmax(query, keys, values, scale=0.25):
    scores = keys.double() @ query.double() * scale  # [n]
    return scores.softmax(0) @ values.double(), scores.logsumexp(0)


def _layout(tails: list[list[int]]):
    """A stand-in layout carrying only what the kernel reads."""
    columns = torch.zeros(len(tails), invariant_plan.TAIL, dtype=torch.int32)
    for r, cols in enumerate(tails):
        columns[r, : len(cols)] = torch.tensor(cols)
    counts = torch.tensor([len(c) for c in tails], dtype=torch.int32)

    class Layout:
        tail_columns, tail_counts, kernel_args = columns, counts, {}

    return Layout()


def _run(query, keys, values, flash_out, flash_lse, tails):
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], D)
    invariant.tail_attention(query, keys, values, flash_out, flash_lse, out, _layout(tails), 0.25)
    return out  # [1, q, H, d]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_merge_equals_a_float64_softmax_over_every_key(dtype, group):
    """Rows with a flash partial over [0, 64) and a tail from 64 on (two blocks), a row with no
    flash keys, a tree row whose tail skips a sibling's column, one spanning past a run."""
    gen = torch.Generator().manual_seed(0)
    tails = [list(range(64, 90)), list(range(64, 128)), list(range(20)), [64, 65, 67, 90]]
    tails.append([64, 70, 400, 599])  # spans more than MAX_SPAN columns: gathered alone
    flash = [64, 64, 0, 64, 64]
    query, keys, values, flash_out, flash_lse = _case(gen, dtype, tails, 600, flash, group)
    got = _run(query, keys, values, flash_out, flash_lse, tails)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for i, (cols, n) in enumerate(zip(tails, flash, strict=True)):
        every = list(range(n)) + cols
        for h in range(KV_HEADS):
            for g in range(group):
                want, _ = _softmax(
                    query[0, h * group + g, i], keys[0, h, every], values[0, h, every]
                )
                assert torch.allclose(got[0, i, h * group + g].double(), want, atol=tol), (i, h, g)


def test_worked_example_one_key_and_an_empty_partial():
    """One tail key and no flash keys: the output is that key's value exactly."""
    group = 3
    query = torch.ones(1, group, 1, D)
    keys, values = (
        torch.zeros(1, 1, 5, D),
        torch.arange(5 * D, dtype=torch.float32).view(1, 1, 5, D),
    )
    flash_out, flash_lse = torch.zeros(1, 1, group, D), torch.full((1, 1, group), -torch.inf)
    out = query.new_empty(1, 1, group, D)
    invariant.tail_attention(query, keys, values, flash_out, flash_lse, out, _layout([[3]]), 1.0)
    assert torch.equal(out[0, 0], values[0, 0, 3].expand(group, D))


def test_worked_example_two_equal_keys_after_a_partial():
    """A partial of output 1 and log-sum-exp 0 (one key of score 0), then two tail keys of score
    0 with values 4 and 7: the three keys weigh a third each, (1 + 4 + 7) / 3 = 4."""
    query = torch.zeros(1, 1, 1, D)
    keys = torch.zeros(1, 1, 3, D)
    values = torch.tensor([0.0, 4.0, 7.0]).view(1, 1, 3, 1).expand(1, 1, 3, D).contiguous()
    flash_out, flash_lse = torch.ones(1, 1, 1, D), torch.zeros(1, 1, 1)
    out = query.new_empty(1, 1, 1, D)
    invariant.tail_attention(query, keys, values, flash_out, flash_lse, out, _layout([[1, 2]]), 1.0)
    assert torch.allclose(out, torch.full_like(out, 4.0), rtol=0, atol=1e-6)


def test_a_row_without_keys_is_refused():
    """Every row reads at least its own key: a count of 0 is a layout bug, refused, not NaN."""
    query, keys, values, flash_out, flash_lse = _case(
        torch.Generator(), torch.float32, [[3]], 5, [0]
    )
    layout = _layout([[3]])
    layout.tail_counts[0] = 0
    out = query.new_empty(1, 1, 3 * KV_HEADS, D)
    with pytest.raises(kernels.KernelUnavailable, match="tail count in 1..64"):
        invariant.tail_attention(query, keys, values, flash_out, flash_lse, out, layout, 0.25)


def _neighbours(rng, columns: int, mine: list[int], others: int) -> list[list[int]]:
    """Tail columns of `others` rows: half near `mine` (they share its run), half anywhere."""
    near = [
        sorted(rng.sample(range(mine[0], mine[0] + 64), rng.randint(1, 64)))
        for _ in range(others // 2)
    ]
    far = [sorted(rng.sample(range(columns), 64)) for _ in range(others - others // 2)]
    return near + far


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gives_the_same_bits_beside_any_rows(dtype, group):
    """Row 0 alone, then beside 1, 7 and 40 other rows (other tasks, runs shared with rows near
    it, rows gathered alone), on one thread and on two; row 0 both in a run and gathered:
    bit-identical."""
    gen = torch.Generator().manual_seed(3)
    rng = random.Random(3)
    columns = 2000
    for mine in (list(range(500, 550)), sorted(rng.sample(range(columns), 50))):
        assert (mine[-1] - mine[0] >= MAX_SPAN) == (mine[0] != 500)  # a run, then gathered
        query, keys, values, flash_out, flash_lse = _case(gen, dtype, [mine], columns, [40], group)
        alone = _run(query, keys, values, flash_out, flash_lse, [mine])[0, 0]
        for others in (1, 7, 40):
            tails = [mine] + _neighbours(rng, columns, mine, others)
            q = len(tails)
            many_q = torch.randn(1, group * KV_HEADS, q, D, generator=gen).to(dtype)
            many_q[:, :, 0] = query[:, :, 0]
            fo = torch.randn(1, KV_HEADS, group * q, D, generator=gen).to(dtype)
            fl = torch.randn(1, KV_HEADS, group * q, generator=gen)
            fo[:, :, ::q], fl[:, :, ::q] = flash_out, flash_lse  # row 0's partials (g q + 0)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                try:
                    together = _run(many_q, keys, values, fo, fl, tails)[0, 0]
                finally:
                    torch.set_num_threads(2)
                assert torch.equal(together, alone), (others, threads)


def test_the_build_is_cached_per_source_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv(EnvVar.CACHE, str(tmp_path))
    cc = kernels.compiler()
    built = kernels.build(cc)
    assert built == kernels.library_path(cc)
    assert built.parent == paths.default_cache_dir() / "kernels"  # the platform's cache rule
    stamp = built.stat().st_mtime_ns
    assert kernels.build(cc) == built and built.stat().st_mtime_ns == stamp  # not rebuilt
    library = ctypes.CDLL(str(built))
    assert library.tail_attention


def _fake_compiler(tmp_path, refuse: str) -> str:
    """A cc that fails on any argument containing `refuse` and otherwise runs the real one."""
    script = tmp_path / "fakecc"
    real = kernels.compiler()
    script.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do case "$a" in *{refuse}*) echo "no {refuse} here" >&2; exit 1;; esac; done\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


def test_a_compiler_without_openmp_builds_the_serial_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv(EnvVar.CACHE, str(tmp_path))
    cc = _fake_compiler(tmp_path, "fopenmp")
    built = kernels.build(cc)
    assert built == kernels.library_path(cc, kernels.SERIAL_FLAGS)
    assert ctypes.CDLL(str(built)).tail_attention


def test_a_failing_compiler_is_reported_with_its_words(tmp_path, monkeypatch):
    monkeypatch.setenv(EnvVar.CACHE, str(tmp_path))
    cc = _fake_compiler(tmp_path, "tail_attention.c")
    with pytest.raises(kernels.KernelUnavailable, match="no tail_attention.c here"):
        kernels.build(cc)


def test_a_missing_compiler_is_reported(monkeypatch):
    monkeypatch.setattr(kernels.shutil, "which", lambda name: None)
    with pytest.raises(kernels.KernelUnavailable, match="no C compiler"):
        kernels.compiler()


def test_the_probe_says_invariant_false_without_the_kernel(monkeypatch):
    def unavailable():
        raise kernels.KernelUnavailable("no C compiler (cc, gcc or clang) on PATH")

    monkeypatch.setattr(kernels, "tail_kernel", unavailable)
    report = invariance._probe.__wrapped__(
        ((16, 16),), (4, 2, 16), False, "torch.bfloat16", "cpu", 2, torch.__version__
    )
    assert not report.invariant and "no tail-attention kernel" in report.reason
