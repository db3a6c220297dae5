"""Measurement, apart from the product: benchmarks and their peers (here ``server_load``, the API server's load
test against llama.cpp's ``llama-server``). The product never imports it.

Until the bench package replaces this file, the benches of the module ``engine/bench.py`` (which this package
shadows) are loaded from it, so that ``python -m engine bench`` keeps working.
"""

import importlib.util as _util
import pathlib as _pathlib

_LEGACY = _pathlib.Path(__file__).resolve().parent.parent / "bench.py"
if _LEGACY.exists():
    _spec = _util.spec_from_file_location("engine._bench_module", _LEGACY)
    _module = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
