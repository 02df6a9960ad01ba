"""Aids the tests use, kept out of the package's top level, where the concepts are.

    strict_cupy.py  a CPU stand-in for CuPy that refuses every implicit copy to
                    the host: `backend.set_cuda_module(strict_cupy)` makes
                    device='cuda' run on it, so the tests can prove the engine
                    never slips into NumPy on device arrays, without a GPU.

Nothing in the package imports this subpackage: the tests, tutorial 7 and
the GPU benchmark's dry run do.
"""
