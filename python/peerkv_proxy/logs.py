"""The proxy's logger. Its name predates the package's move out of `peerkv`
and is kept so log filters written for it still match."""

import logging

log = logging.getLogger("peerkv.proxy")
