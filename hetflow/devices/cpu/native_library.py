"""Compiled jobs as one shared library: the code a compiled package (``hetflow_lite``) runs without numba.

Why: numba and llvmlite are a compiler. Loading them costs a process ~60 MiB before it runs anything
(LLVM's relocated pages, numba's registries), more than a small network's whole run takes in ONNX
Runtime. A model whose run is captured as jobs (``hetflow.runtime.replay``) needs none of it afterwards:
its jobs are machine code reached by address, fed argument blocks of plain integers.

How: every job function is compiled again by numba, uncached (a cached job keeps only object code built
for the JIT, whose absolute relocations a shared library cannot hold), and its optimised LLVM module is
emitted by a position-independent target machine for the same CPU and features. In each module only
the C entry point stays visible, renamed (``hetflow_job_<i>``); the functions numba linked in are made
internal, so the modules' shared helpers never clash. The system's C compiler links the objects with a
small C file for what numba's JIT resolved at run time: the CBLAS routines the GEMM drivers call by
fixed names (``jit_gemm``: trampolines through pointers the loader sets); the parts of numba's runtime
(NRT) that a job's scratch arrays use (allocation and release) and its no-copy reshape; and, for the
rest of numba's helpers (raising an exception, taking the GIL), stubs that stop the process with the
helper's name: they are reached only where a job raises, which a captured run's jobs do not.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm
import numba
from numba.core import types

from hetflow.devices.cpu import spin_pool
from hetflow.errors import HetflowError

#: The library's two fixed entry points (``spin_pool.replay_entry``, ``spin_pool.serve_entry``).
REPLAY_SYMBOL = "hetflow_replay"
SERVE_SYMBOL = "hetflow_serve"
#: The loader's hook for the CBLAS routines: hetflow_bind_blas(sgemm, dgemm, sgemv, dgemv).
BIND_BLAS_SYMBOL = "hetflow_bind_blas"

#: Prefixes of numba's runtime and helper functions, stubbed in the library (see the module docstring).
_NUMBA_RUNTIME_PREFIXES = ("NRT_", "numba_")

_SHIM = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void hetflow_missing(const char *name) {
    fprintf(stderr, "hetflow_lite: a compiled job reached %s, which a compiled package does not provide "
                    "(a job that allocates or raises); run the model with hetflow instead\n", name);
    fflush(stderr);
    abort();
}

typedef void (*gemm_s)(int32_t, int32_t, int32_t, int64_t, int64_t, int64_t, float, uintptr_t, int64_t,
                       uintptr_t, int64_t, float, uintptr_t, int64_t);
typedef void (*gemm_d)(int32_t, int32_t, int32_t, int64_t, int64_t, int64_t, double, uintptr_t, int64_t,
                       uintptr_t, int64_t, double, uintptr_t, int64_t);
typedef void (*gemv_s)(int32_t, int32_t, int64_t, int64_t, float, uintptr_t, int64_t, uintptr_t, int64_t,
                       float, uintptr_t, int64_t);
typedef void (*gemv_d)(int32_t, int32_t, int64_t, int64_t, double, uintptr_t, int64_t, uintptr_t, int64_t,
                       double, uintptr_t, int64_t);
static gemm_s sgemm;
static gemm_d dgemm;
static gemv_s sgemv;
static gemv_d dgemv;

void hetflow_bind_blas(void *s, void *d, void *sv, void *dv) {
    sgemm = (gemm_s)s; dgemm = (gemm_d)d; sgemv = (gemv_s)sv; dgemv = (gemv_d)dv;
}

void hetflow_sgemm(int32_t o, int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k, float alpha,
                   uintptr_t a, int64_t lda, uintptr_t b, int64_t ldb, float beta, uintptr_t c, int64_t ldc) {
    if (!sgemm) hetflow_missing("cblas sgemm");
    sgemm(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void hetflow_dgemm(int32_t o, int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k, double alpha,
                   uintptr_t a, int64_t lda, uintptr_t b, int64_t ldb, double beta, uintptr_t c, int64_t ldc) {
    if (!dgemm) hetflow_missing("cblas dgemm");
    dgemm(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void hetflow_sgemv(int32_t o, int32_t t, int64_t m, int64_t n, float alpha, uintptr_t a, int64_t lda,
                   uintptr_t x, int64_t incx, float beta, uintptr_t y, int64_t incy) {
    if (!sgemv) hetflow_missing("cblas sgemv");
    sgemv(o, t, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

void hetflow_dgemv(int32_t o, int32_t t, int64_t m, int64_t n, double alpha, uintptr_t a, int64_t lda,
                   uintptr_t x, int64_t incx, double beta, uintptr_t y, int64_t incy) {
    if (!dgemv) hetflow_missing("cblas dgemv");
    dgemv(o, t, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

/* numba's no-copy reshape (every reshape inside a job): the new strides of the same memory seen with
   ``newdims``, or 0 where the reshape needs a copy. Axes of length 1 are dropped, then
   runs of old and new axes with equal products are matched, each run of old axes must be contiguous
   among themselves, and the new axes of a run take strides from the run's innermost (C order) or
   outermost (Fortran order) old stride. */
int numba_attempt_nocopy_reshape(int64_t nd, const int64_t *dims, const int64_t *strides, int64_t newnd,
                                 const int64_t *newdims, int64_t *newstrides, int64_t itemsize,
                                 int32_t is_f_order) {
    int64_t olddims[64], oldstrides[64], oldnd = 0, new_size = 1, old_size = 1;
    if (nd > 64) return 0;
    for (int64_t i = 0; i < nd; i++) {
        if (dims[i] != 1) { olddims[oldnd] = dims[i]; oldstrides[oldnd] = strides[i]; oldnd++; }
    }
    for (int64_t i = 0; i < newnd; i++) new_size *= newdims[i];
    for (int64_t i = 0; i < oldnd; i++) old_size *= olddims[i];
    if (new_size != old_size) return 0;
    if (new_size == 0) {  /* no element is ever read: any strides do (numba gives the item size) */
        for (int64_t i = 0; i < newnd; i++) newstrides[i] = itemsize;
        return 1;
    }
    int64_t oi = 0, oj = 1, ni = 0, nj = 1;
    while (ni < newnd && oi < oldnd) {
        int64_t np_ = newdims[ni], op = olddims[oi];
        while (np_ != op) {
            if (np_ < op) np_ *= newdims[nj++]; else op *= olddims[oj++];
        }
        for (int64_t ok = oi; ok < oj - 1; ok++) {
            if (is_f_order ? oldstrides[ok + 1] != olddims[ok] * oldstrides[ok]
                           : oldstrides[ok] != olddims[ok + 1] * oldstrides[ok + 1]) return 0;
        }
        if (is_f_order) {
            newstrides[ni] = oldstrides[oi];
            for (int64_t nk = ni + 1; nk < nj; nk++) newstrides[nk] = newstrides[nk - 1] * newdims[nk - 1];
        } else {
            newstrides[nj - 1] = oldstrides[oj - 1];
            for (int64_t nk = nj - 1; nk > ni; nk--) newstrides[nk - 1] = newstrides[nk] * newdims[nk];
        }
        ni = nj++;
        oi = oj++;
    }
    int64_t last = ni >= 1 ? newstrides[ni - 1] : itemsize;
    if (is_f_order && ni >= 1) last *= newdims[ni - 1];
    for (int64_t nk = ni; nk < newnd; nk++) newstrides[nk] = last;
    return 1;
}

/* numba's runtime (NRT), as much of it as a job's scratch arrays use. A MemInfo starts with the fields
   compiled code reads in place: the reference count (at 0) and the data pointer (the fourth word); the
   MemInfo and its data are one allocation here, so that dropping the last reference frees both. */
typedef void (*nrt_dtor)(void *data, size_t size, void *info);
typedef struct {
    size_t refct;
    nrt_dtor dtor;
    void *dtor_info;
    void *data;
    size_t size;
    void *external_allocator;
} nrt_meminfo;

void *NRT_Allocate(size_t size) {
    void *memory = malloc(size ? size : 1);
    if (!memory) hetflow_missing("memory (malloc failed)");
    return memory;
}

void NRT_Free(void *memory) { free(memory); }

void *NRT_MemInfo_alloc_aligned(size_t size, uint32_t align) {
    size_t alignment = align > 16 ? align : 16;
    char *block = NRT_Allocate(sizeof(nrt_meminfo) + alignment + size);
    nrt_meminfo *info = (nrt_meminfo *)block;
    uintptr_t data = (uintptr_t)(block + sizeof(nrt_meminfo));
    data = (data + alignment - 1) / alignment * alignment;
    info->refct = 1;
    info->dtor = NULL;
    info->dtor_info = NULL;
    info->data = (void *)data;
    info->size = size;
    info->external_allocator = NULL;
    return info;
}

void *NRT_MemInfo_alloc(size_t size) { return NRT_MemInfo_alloc_aligned(size, 16); }

void NRT_MemInfo_call_dtor(void *meminfo) {
    nrt_meminfo *info = meminfo;
    if (info->dtor) info->dtor(info->data, info->size, info->dtor_info);
    free(info);
}
"""

#: numba runtime and helper functions the shim defines (the others the modules declare are stubbed).
_SHIM_DEFINED = frozenset({"numba_attempt_nocopy_reshape", "NRT_Allocate", "NRT_Free", "NRT_MemInfo_alloc",
                           "NRT_MemInfo_alloc_aligned", "NRT_MemInfo_call_dtor"})  # fmt: skip


@dataclass(frozen=True)
class NativeEntry:
    """One function of the library: its exported symbol, its Python function and its C signature."""

    symbol: str
    function: Callable[..., object]
    signature: types.Signature


def job_entries(functions: Sequence[Callable[..., None]]) -> list[NativeEntry]:
    """The library's entries: the replay and worker loops, then ``functions`` as ``hetflow_job_<i>``."""
    return [
        NativeEntry(REPLAY_SYMBOL, spin_pool.replay_entry, spin_pool.REPLAY_ENTRY_SIGNATURE),
        NativeEntry(SERVE_SYMBOL, spin_pool.serve_entry, spin_pool.SERVE_ENTRY_SIGNATURE),
        *(NativeEntry(job_symbol(index), function, spin_pool.JOB_SIGNATURE) for index, function in enumerate(functions)),
    ]


def job_symbol(index: int) -> str:
    """The exported name of the library's job ``index`` (``job_entries``' order)."""
    return f"hetflow_job_{index}"


def c_compiler() -> str:
    """The system's C compiler (``cc``, else ``gcc``, else ``clang``), which links the library."""
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    raise HetflowError("a compiled package needs a C compiler to link its kernels (cc, gcc or clang); none found")


def target_description() -> dict[str, str]:
    """The target the library is built for: LLVM's triple, CPU name and features (as numba compiles)."""
    codegen = _codegen()
    return {
        "triple": llvm.get_process_triple(),
        "cpu": codegen._get_host_cpu_name(),
        "features": codegen._get_host_cpu_features(),
    }


#: Told of each entry as it is compiled: (index, count, the function's name).
Progress = Callable[[int, int, str], None]


def build_library(entries: Sequence[NativeEntry], output: Path, progress: Progress | None = None) -> None:
    """Compile ``entries`` into the shared library ``output`` (see the module docstring); a few seconds
    an entry (numba compiles each again)."""
    from hetflow.devices.cpu.kernels import jit_gemm

    compiler = c_compiler()
    jit_gemm.available()  # binds hetflow_sgemm & co in numba's JIT, which the GEMM jobs need to compile
    machine = _position_independent_machine()
    declared: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="hetflow-native-") as folder:
        objects = []
        for index, entry in enumerate(entries):
            if progress is not None:
                progress(index, len(entries), entry.function.__qualname__)
            module = _entry_module(entry)
            declared.update(f.name for f in module.functions if f.is_declaration and not f.name.startswith("llvm."))
            path = Path(folder) / f"entry{index}.o"
            path.write_bytes(machine.emit_object(module))
            objects.append(str(path))
        shim = Path(folder) / "shim.c"
        shim.write_text(_SHIM + _runtime_stubs(declared))
        # -Bsymbolic: the library's calls to its own NRT, BLAS and job symbols never bind elsewhere in the process.
        command = [compiler, "-shared", "-fPIC", "-O2", "-Wl,-Bsymbolic", "-o", str(output), *objects, str(shim), "-lm"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise HetflowError(f"linking the compiled package's kernels failed:\n{done.stderr[-2000:]}")


def _codegen():  # noqa: ANN202
    from numba.core.registry import cpu_target

    return cpu_target.target_context.codegen()


def _position_independent_machine() -> llvm.TargetMachine:
    described = target_description()
    target = llvm.Target.from_triple(described["triple"])
    return target.create_target_machine(cpu=described["cpu"], features=described["features"], opt=3,
                                        reloc="pic", codemodel="default")  # fmt: skip


def _entry_module(entry: NativeEntry) -> llvm.ModuleRef:
    """``entry`` compiled by numba (uncached), its C wrapper renamed to the entry's symbol and everything
    else it defines made internal."""
    compiled = numba.cfunc(entry.signature, nogil=True)(entry.function)
    module = llvm.parse_assembly(compiled.inspect_llvm())
    for function in module.functions:
        if function.is_declaration:
            continue
        if function.name == compiled.native_name:
            function.name = entry.symbol
        else:
            function.linkage = "internal"
    for variable in module.global_variables:
        if not variable.is_declaration:
            variable.linkage = "internal"
    module.verify()
    return module


def _runtime_stubs(declared: set[str]) -> str:
    """C definitions that stop the process for numba's runtime and helper functions the modules declare."""
    names = sorted(n for n in declared if n.startswith(_NUMBA_RUNTIME_PREFIXES) and n not in _SHIM_DEFINED)
    return "".join(f'\nvoid {name}(void) {{ hetflow_missing("{name}"); }}\n' for name in names)
