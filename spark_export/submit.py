"""Entry point for ``spark-submit``: ``spark-submit [--master URL] spark_export/submit.py
analyze|compact ...`` (the project must be importable on the driver: installed, or
its folder on ``PYTHONPATH``). Without ``--master`` in the job's own arguments, the
master is the one spark-submit was given."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from spark_export.__main__ import main

    # No default master: the session keeps the one spark-submit was given.
    sys.exit(main(default_master=None))
