"""(being written)"""

from ._main import build_parser as build_parser
from ._main import main as main

__all__ = ["build_parser", "main"]
