"""A process recording synthetic traffic with a live endpoint, until it is killed.

    python stream_tokens.py TRACE_DIR HOST:PORT PREFIX [TOKENS_PER_REQUEST]

Prints ``ready HOST:PORT`` on stdout once the endpoint listens. The token is
taken from $TRACETOOL_LIVE_TOKEN when set (as --live-token does).
"""

import sys
import time

from collectors.recorder import Recorder


def main() -> None:
    out, addr, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    rec = Recorder(out, live=addr).start()
    print(f"ready {rec.live.address}", flush=True)
    k = 0
    while True:
        with rec.request(f"{prefix}{k}", prompt_tokens=8) as req:
            with req.span("server.request"), req.span("decode"):
                for i in range(tokens):
                    req.token(i, kv_len=8 + i)
            req.output_tokens = tokens
        k += 1
        time.sleep(0.01)


if __name__ == "__main__":
    main()
