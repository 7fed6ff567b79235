"""The ``ttlbroker`` command (and ``python -m broker``): ``serve`` starts a broker;
``check`` and ``repair`` look after a stopped broker's data directory; every other
command is a client of a running broker, through ``broker.client``.

What this package owns: the command line: the parser and its global options
(``_main.py``, ``_parser.py``, ``_args.py``), running one client command, and how a
command ends when it fails: one named line and the exit status (``_run.py``,
``_exits.py``), the commands themselves (``_commands.py``, ``_consumer.py``,
``_kv.py``, ``_reports.py``, ``_request.py`` for req and reply, ``_server.py`` for
server info and ping, ``_bench.py``, ``pub``'s templates in ``_templates.py``), how
they print (``_output.py``, ``_tables.py``, ``_progress.py``), the question before a
removal (``_confirm.py``) and the contexts, named connection options kept in files of
this machine (``_contexts.py``, through ``storage``'s file primitives).

What it may import: it is the top layer, so anything below it: ``broker.server``
(for ``serve``), ``broker.core``, ``broker.config``, ``broker.client``, ``storage``
and ``spark_export`` (for ``check`` and ``repair``, and ``spark_export.cli`` for
``analyze``, ``compact`` and ``load``), ``protocol``, always through their public
names. Nothing imports it but ``broker.__main__`` and the ``ttlbroker`` console
script. A client command imports neither the server nor pyarrow, and the parser
neither pyarrow nor pyspark.

Public names: :func:`main` (the console script ``broker.cli:main``) and
:func:`build_parser` (the whole parser, for tests and shell completion).
"""

from ._main import build_parser as build_parser
from ._main import main as main

__all__ = ["build_parser", "main"]
