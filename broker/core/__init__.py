"""(being written)"""

from ._info import VERSION as VERSION
from ._log import configure_logging as configure_logging
from ._log import get_logger as get_logger
