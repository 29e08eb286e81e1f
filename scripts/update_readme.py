#!/usr/bin/env python
"""Regenerate the results sections of README.md from the committed results files.

Each block between ``<!-- results:NAME:start -->`` and ``<!-- results:NAME:end -->`` is replaced
by ``fairseq_headprune.summary.summarize(docs/results/NAME)`` (a sentence saying so where that
folder does not exist yet), each block between
``<!-- output:FILE:start -->`` and ``<!-- output:FILE:end -->`` by FILE (a command transcript under
docs/results) in a code fence, and each block between ``<!-- paper:NAME:start -->`` and
``<!-- paper:NAME:end -->`` by the paper's table NAME of ``fairseq_headprune.evaluation.paper_table``
(with our numbers beside the paper's once docs/results/reproduce/NAME/NAME.json exists), and each
block between ``<!-- method:NAME:start -->`` and ``<!-- method:NAME:end -->`` by method NAME's
line of the demo comparison (``compare.method_line`` of docs/results/cpu_small_compare); nothing
in them is typed by hand.
"""

import argparse
import os
import re

from fairseq_headprune.evaluation.compare import method_line
from fairseq_headprune.evaluation.paper_table import readme_block
from fairseq_headprune.evaluation.summary import summarize
from fairseq_headprune.io import write_text


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--readme", default="README.md", help="(default: %(default)s)")
    parser.add_argument("--results", default="docs/results", help="(default: %(default)s)")
    opts = parser.parse_args()
    with open(opts.readme, encoding="utf-8") as f:
        text = f.read()

    def block(match):
        name = match.group(1)
        folder = os.path.join(opts.results, name)
        body = summarize(folder) if os.path.isdir(folder) else (
            f"No results committed yet ({folder} does not exist).\n")
        return f"<!-- results:{name}:start -->\n{body}<!-- results:{name}:end -->"

    def output(match):
        name = match.group(1)
        with open(os.path.join(opts.results, name), encoding="utf-8") as f:
            body = f.read()
        return f"<!-- output:{name}:start -->\n```\n{body}```\n<!-- output:{name}:end -->"

    def paper(match):
        name = match.group(1)
        body = readme_block(name, os.path.join(opts.results, "reproduce"))
        return f"<!-- paper:{name}:start -->\n{body}<!-- paper:{name}:end -->"

    def method(match):
        name = match.group(1)
        path = os.path.join(opts.results, "cpu_small_compare", "compare", "compare.json")
        body = method_line(path, name) if os.path.exists(path) else (
            f"No comparison committed yet ({path} does not exist).\n")
        return f"<!-- method:{name}:start -->\n{body}<!-- method:{name}:end -->"

    new = re.sub(r"<!-- results:([\w-]+):start -->.*?<!-- results:\1:end -->", block, text,
                 flags=re.S)
    new = re.sub(r"<!-- output:([\w./-]+):start -->.*?<!-- output:\1:end -->", output, new,
                 flags=re.S)
    new = re.sub(r"<!-- paper:([\w-]+):start -->.*?<!-- paper:\1:end -->", paper, new, flags=re.S)
    new = re.sub(r"<!-- method:([\w-]+):start -->.*?<!-- method:\1:end -->", method, new,
                 flags=re.S)
    write_text(opts.readme, new)


if __name__ == "__main__":
    main()
