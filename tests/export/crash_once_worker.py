"""``python crash_once_worker.py MARK``: the export worker (``spark_export.worker``),
except that it dies at once (exit 3) when MARK does not exist yet, creating it."""

import os
import sys

from spark_export import worker

if not os.path.exists(sys.argv[1]):
    open(sys.argv[1], "w").close()
    os._exit(3)
sys.exit(worker.main())
