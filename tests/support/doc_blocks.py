"""The docs' fenced blocks, for the tests that run them: tests/test_doc_shell.py (shell) and tests/test_docs.py (Python).

Every fenced block of README.md, docs/*.md and deploy/**/*.md names its language. A block that those tests do not
run sits right under `<!-- not run here: REASON -->`, and the reason names the test that runs the same thing (a
`tests/...` path or a `make` target) or why nothing here can (Docker, Kubernetes, a GPU, the network, root).
"""

import glob
import os
import re
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md"] + sorted(glob.glob("docs/*.md", root_dir=ROOT)) + sorted(
    glob.glob("deploy/**/*.md", root_dir=ROOT, recursive=True))
NOT_RUN = re.compile(r"<!--\s*not run here\b:?(.*?)-->")
FENCE = re.compile(r"^```")
NAMED_TEST = re.compile(r"\btests/[\w./-]*[\w/]|\bmake ([\w-]+)")
WHY_NOTHING_CAN = re.compile(r"\b(Docker|Kubernetes|kubectl|GPU|the network|root)\b")


@dataclass(frozen=True)
class Block:
    doc: str
    language: str
    body: str
    line: int           # of the opening fence, from 1
    reason: str = None  # the `not run here` reason ('' when it has none); None when the doc tests run the block

    def __str__(self):
        return f"{self.doc}:{self.line}"


def blocks(doc):
    """Every fenced block of `doc` (a path under the repository), in order."""
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        lines = f.read().split("\n")
    found, i = [], 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
            assert end is not None, f"{doc}:{i + 1}: the block is never closed (it swallows the rest of the file)"
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = NOT_RUN.search(before)
            found.append(Block(doc, lines[i][3:].strip(), "\n".join(lines[i + 1:end]), i + 1,
                               marker and marker.group(1).strip()))
            i = end + 1
        else:
            i += 1
    return found


def every_block(languages=None):
    """The blocks of every doc (of those `languages` when given)."""
    return [block for doc in DOCS for block in blocks(doc) if languages is None or block.language in languages]


def python_block(doc, containing):
    """The one ```python block of `doc` whose code contains `containing` (for a test that runs it against its own
    fixtures); AssertionError when there is not exactly one."""
    found = [block for block in blocks(doc) if block.language == "python" and containing in block.body]
    assert len(found) == 1, f"{doc}: {len(found)} python blocks contain {containing!r}, not 1"
    return found[0]


def marker_problem(reason):
    """'' when a `not run here` reason follows the rule, else what is wrong with it."""
    if not reason:
        return "gives no reason"
    for match in NAMED_TEST.finditer(reason):
        if match.group(1):
            with open(os.path.join(ROOT, "Makefile")) as f:
                if not re.search(rf"^{re.escape(match.group(1))}:", f.read(), re.M):
                    return f"names `make {match.group(1)}`, which the Makefile does not have"
        elif not os.path.exists(os.path.join(ROOT, match.group(0))):
            return f"names {match.group(0)}, which does not exist"
    if not (NAMED_TEST.search(reason) or WHY_NOTHING_CAN.search(reason)):
        return ("names neither the test that runs the same thing (a tests/ path or a make target) nor why nothing "
                "can (Docker, Kubernetes, a GPU, the network, root)")
    return ""
