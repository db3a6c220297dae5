"""The script PyInstaller freezes: inside the bundle it runs as ``__main__`` and hands over to ``app.__main__``."""

import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
