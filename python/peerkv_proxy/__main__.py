"""`python -m peerkv_proxy`: the same command as `peerkv proxy`."""

import sys

from peerkv_proxy.cli import main

if __name__ == "__main__":
    sys.exit(main())
