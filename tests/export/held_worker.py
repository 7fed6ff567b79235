"""``python held_worker.py FIFO [PIDFILE]``: the export worker (``spark_export.worker``),
held after its first segment until something is written to FIFO (progress and
shutdown tests); it writes its process id to PIDFILE first."""

import os
import sys

from spark_export import worker

real = worker.export_segments


def held(root, jobs, report, started, progress, **more):  # type: ignore[no-untyped-def]
    def step(entry, n, of):  # type: ignore[no-untyped-def]
        progress(entry, n, of)
        if n == 1:
            with open(sys.argv[1]) as fifo:
                fifo.read()

    return real(root, jobs, report=report, started=started, progress=step, **more)


worker.export_segments = held
if len(sys.argv) > 2:
    with open(sys.argv[2], "w") as f:
        f.write(str(os.getpid()))
sys.exit(worker.main())
