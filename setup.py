"""Build glue for the optional C extension engine.backends.cpu._kernels (everything else is in pyproject.toml).

The extension is optional: when it cannot be compiled the install still succeeds and
``engine.backends.cpu.kernels.AVAILABLE`` is False (the engine then falls back to NumPy).
SIMD paths are chosen at run time, so the build never uses -march=native.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CSRC = Path("engine/backends/cpu/csrc")
SOURCES = ["module.c", "matmul.c", "pool.c", "kernels_scalar.c", "kernels_iq_tables.c", "kernels_avx2.c", "kernels_avxvnni.c",
           "kernels_avx512.c", "kernels_avx512_rows16.c", "kernels_avx512_k16.c", "kernels_iq_gemm.c", "kernels_avx2_iq.c",
           "kernels_avxvnni_iq.c", "kernels_avx512_iq.c", "kernels_repack16.c",
           "kernels_neon.c", "kernels_dotprod.c",
           "decoder.c", "decoder_module.c", "products.c", "attention.c", "moe.c", "vecops_scalar.c", "vecops_avx2.c",
           "vecops_avx512.c", "sampling.c", "sampling_draw.c", "strings.c"]


class OptionalBuildExt(build_ext):
    """Compile with the project's flags; report and carry on when the compiler fails."""

    def finalize_options(self) -> None:
        super().finalize_options()
        import numpy  # a build requirement (pyproject.toml [build-system])

        self.include_dirs.append(numpy.get_include())

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":
            for ext in self.extensions:
                ext.extra_compile_args = ["-O3", "-std=gnu11", "-pthread", "-fno-strict-aliasing", "-Wall", "-Wno-unused-function"]
                ext.extra_link_args = ["-pthread"]
        super().build_extensions()

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - any compiler failure leaves the NumPy fallback
            self.warn(f"the CPU kernels were not built ({e}); Hearth will fall back to NumPy")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self.warn(f"the CPU kernels were not built ({e}); Hearth will fall back to NumPy")


setup(
    ext_modules=[
        Extension(
            "engine.backends.cpu._kernels",
            sources=[str(CSRC / name) for name in SOURCES],
            depends=[str(p) for p in CSRC.glob("*.[hi]*")],
            define_macros=[("NPY_TARGET_VERSION", "NPY_1_23_API_VERSION")],
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
