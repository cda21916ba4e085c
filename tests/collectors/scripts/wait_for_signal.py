"""No torch: says it is ready, then waits on stdin until a signal ends it."""

import sys

print("ready", flush=True)
sys.stdin.readline()
