"""Every test, and every app process a test starts, shares one assembled copy of the built-in model.

It lives in ``builtin/`` of the test model cache (``tests/model_store.builtin_dir``) unless ``HEARTH_BUILTIN_DIR``
is already set, so no test writes 490 MB into the user's own data folder or into a temporary one.
"""

import os

from tests.model_store import builtin_dir

os.environ.setdefault("HEARTH_BUILTIN_DIR", str(builtin_dir()))
