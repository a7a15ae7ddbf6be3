"""`python -m tests.support.collector_off [ARGS]` runs the service module named by ZMQFLOW_TEST_MODULE (its
`python -m` entry point, with ARGS) with Python's cyclic garbage collector off.

Why: objects that refer to each other outlive their work until the collector runs, and it runs seldom enough that
the memory they hold comes and goes without a trend (the aggregator's calls and their Gathers: hundreds of answered
requests waiting in its oldest generation). With the collector off, whatever a request leaves in a cycle stays, so a
soak (tests/soak/) sees every such cycle as growth in proportion to the requests served.
"""

import gc
import os
import runpy

MODULE_ENV = "ZMQFLOW_TEST_MODULE"

if __name__ == "__main__":
    gc.disable()
    runpy.run_module(os.environ[MODULE_ENV], run_name="__main__", alter_sys=True)
