"""README.md's generated blocks (results, transcripts, paper tables, the comparison's method
lines) are what scripts/update_readme.py makes of the committed results files: none is typed or
edited by hand, and none is stale."""

import os
import shutil
import subprocess
import sys

from conftest import REPO


def test_readme_is_regenerated_from_results(tmp_path):
    readme = tmp_path / "README.md"
    shutil.copy(os.path.join(REPO, "README.md"), readme)
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "update_readme.py"),
                    "--readme", str(readme), "--results", "docs/results"], cwd=REPO, check=True,
                   capture_output=True)
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        committed = f.read()
    assert readme.read_text(encoding="utf-8") == committed
