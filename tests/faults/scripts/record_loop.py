"""A host that records N token rows in a loop: the subject of the disk-fault tests.

    python record_loop.py OUT N [--pause-at K] [--segment-bytes B] [--fsize-limit BYTES]

Every 100 rows it flushes and prints ``flushed <rows>`` (every row below is on
disk). With ``--pause-at K`` it prints ``paused`` after K rows and waits for a
line on stdin (the test breaks the disk meanwhile). At the end it closes the
recorder and prints one JSON line: rows written and dropped as the writer counts
them, the writer's failure, and the collector error count. Exit 0 means the
host ran to the end whatever happened to the disk.
"""

import argparse
import json
import resource
import signal
import sys

from collectors import Recorder

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("n", type=int)
ap.add_argument("--pause-at", type=int, default=-1)
ap.add_argument("--segment-bytes", type=int, default=256 << 20)
ap.add_argument("--fsize-limit", type=int, default=0)
a = ap.parse_args()
if a.fsize_limit:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (a.fsize_limit, a.fsize_limit))

rec = Recorder(a.out, flush_interval_s=3600, flush_rows=1 << 30, segment_bytes=a.segment_bytes,
               compression=None).start()
with rec.request("r") as req:
    for i in range(a.n):
        req.token(i, kv_len=100 + i, emit_ns=1_000_000 + i)
        rec.add_span("decode", i, i + 1)
        if i % 100 == 99:
            rec.writer.flush()
            print(f"flushed {i + 1}", flush=True)
        if i + 1 == a.pause_at:
            print("paused", flush=True)
            sys.stdin.readline()
rec.close()
tokens = rec.writer.sink("tokens")
print(json.dumps({"written": tokens.rows_written, "dropped": tokens.dropped, "failed": rec.writer.failed,
                  "errors": rec.errors}), flush=True)
