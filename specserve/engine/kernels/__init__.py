"""The engine's own C kernel (`tail_attention.c`), built with this machine's C compiler on first
use into the cache directory (one file per source, compiler, flags and CPU) and called through
ctypes; `tail_kernel()` raises `KernelUnavailable`, with the compiler's words, where none builds."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("tail_attention.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
SERIAL_FLAGS = tuple(f for f in FLAGS if f != "-fopenmp")  # a compiler without OpenMP: one thread
LANES, MAX_HEAD_DIM = 8, 256  # tail_attention.c's LANES and MAX_D


class KernelUnavailable(RuntimeError):
    """No C compiler here, the kernel did not build, or it does not take these shapes."""


def compiler() -> str:
    """$CC where set, else the first of cc, gcc, clang on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise KernelUnavailable("no C compiler (cc, gcc or clang) on PATH; set CC to one")


def library_path(cc: str, flags: tuple[str, ...] = FLAGS) -> Path:
    """Where the kernel built by `cc` with `flags` for this CPU lives (the name hashes what shapes
    the code)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    parts = [
        SOURCE.read_bytes(),
        version.stdout.encode(),
        _cpu_flags().encode(),
        *map(str.encode, flags),
    ]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return _cache_root() / "kernels" / f"tail_attention-{key}.so"


def build(cc: str) -> Path:
    """The shared library, built once (with OpenMP where the compiler has it, else serial):
    concurrent builders each write their own file and rename it into place."""
    failed = ""
    for flags in (FLAGS, SERIAL_FLAGS):
        target = library_path(cc, flags)
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            command = [cc, *flags, str(SOURCE), "-o", str(built), "-lm"]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode == 0:
                os.replace(built, target)
                return target
            failed = done.stderr[-2000:]
    raise KernelUnavailable(f"{cc} failed on {SOURCE.name}: {failed}")


@functools.cache
def tail_kernel() -> ctypes.PyDLL:
    """The loaded library, its `tail_attention(ptrs, ints, scale)` typed (it keeps the GIL: a
    call lasts microseconds)."""
    library = ctypes.PyDLL(str(build(compiler())))
    function = library.tail_attention
    function.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_long),
        ctypes.c_float,
    ]
    function.restype = ctypes.c_int
    return library


def _cache_root() -> Path:
    """$SPECSERVE_CACHE, else ~/.cache/specserve: the platform's cache rule (`specserve.paths`),
    read here because the engine imports nothing outside itself."""
    root = os.environ.get("SPECSERVE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "specserve"


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next((line for line in text.splitlines() if line.startswith("flags")), "")
