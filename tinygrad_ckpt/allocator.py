"""Ask the C allocator to keep the memory a training step frees, for the next step.

Every step allocates the same arrays and frees them again. NumPy takes an
array's memory from the C library's malloc, and glibc's malloc (Linux) does
not keep all of what is freed. As mallopt(3) describes it:

  - a freed block at the top of the heap goes back to the system once more
    than M_TRIM_THRESHOLD bytes are free there;
  - a block of M_MMAP_THRESHOLD bytes or more is its own mmap, unmapped when
    it is freed;
  - both thresholds start at 128 KiB and grow as larger blocks are freed
    (the mmap threshold to the largest freed block, up to 32 MiB on 64-bit;
    the trim threshold to twice that).

So at the end of a backward, when the step's activations and gradients are
freed, the top of the heap goes back, and the next forward writes to pages
the kernel must find and zero again: one minor page fault per 4 KiB. On the
GPT workload (W2), alone in a fresh process, that was about 20,000 faults
a step and 7 to 24 % of its time; on `tinygrad-ckpt train`'s default run,
27 % (benchmarks/README.md, "The allocator"; `tinygrad-ckpt bench --profile` prints
the count).

`keep_freed_memory()` sets both thresholds once (mallopt), so the heap keeps
what a step frees and the next step reuses it. That is the idea of PyTorch's
CUDA caching allocator, here asked of the C allocator: in PyTorch 2.13.0,
torch.cuda.memory_reserved() is "the current GPU memory managed by the caching
allocator", and empty_cache() releases "all unoccupied cached memory currently
held by the caching allocator" (torch/cuda/memory.py). It is a setting of the whole process, not of this
package, which is why the package never calls it on import: the Trainer calls
it when TrainingArguments.keep_freed_memory is set (False unless asked). The
command line owns its process, so `tinygrad-ckpt train` and `bench` call it
by default (--no-keep-freed-memory: they do not). The arrays the engine counts (memory.py) are
the same either way; only what the process holds after a step differs (its
resident size stays at the step's peak).

What does not live here: the memory accounting (memory.py), devices (backend.py).
"""

import ctypes
import ctypes.util

# mallopt's parameter numbers, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# The largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX
# in mallopt(3)): blocks below it come from the heap, which now keeps them.
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024

# How much free memory the top of the heap may hold before glibc trims it: more
# than any step here frees (trimming stays possible, at 1 GiB free).
TRIM_THRESHOLD = 1024 * 1024 * 1024


def keep_freed_memory():
    """Tell glibc's malloc to keep freed memory for reuse; returns (applied, why).

    applied is True when both settings took; otherwise why says what stopped
    it (not glibc, e.g. macOS or musl; or mallopt refused a value), and
    nothing changed beyond what `why` names. Calling it again does no harm.
    """
    libc = _glibc()
    if libc is None:
        return False, "the C library is not glibc (mallopt is glibc's); freed memory is handled as before"
    # The mmap threshold first: setting either one stops glibc's own
    # adjustment of both, and the mmap threshold would stay at 128 KiB.
    for name, parameter, value in (("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX),
                                   ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        if libc.mallopt(parameter, value) != 1:
            return False, f"mallopt({name}, {value}) was refused by this C library"
    return True, (f"glibc keeps freed memory: blocks under {MMAP_THRESHOLD_MAX >> 20} MiB come from the heap, "
                  f"trimmed only past {TRIM_THRESHOLD >> 20} MiB free")


def _glibc():
    """The C library through ctypes if it is glibc (it has mallopt and gnu_get_libc_version), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not (hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt")):  # the first is glibc's only
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc
