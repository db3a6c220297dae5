"""Entry point of ``python -m engine``."""

from .cli import main

raise SystemExit(main())
