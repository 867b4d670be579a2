"""Ray and torch are optional: ``import datasetrt`` and its loader work without
them, and the adapters say what is missing."""

from __future__ import annotations

import subprocess
import sys


def test_import_datasetrt_needs_neither_ray_nor_torch(tmp_path):
    script = (
        "import sys\n"
        "sys.modules['ray'] = None; sys.modules['torch'] = None\n"
        "import datasetrt as drt\n"
        "class S:\n"
        "    name = 's-v1'\n"
        "    def __iter__(self):\n"
        "        return iter([(b'x', {'label': 1})] * 5)\n"
        "ds = drt.build(sys.argv[1], [S()], progress=False)\n"
        "assert sum(len(b) for b in ds.loader(2, seed=1)) == 5\n"
        "for adapter in (ds.to_ray, ds.to_torch):\n"
        "    try:\n"
        "        adapter(2, seed=1)\n"
        "    except ImportError as exc:\n"
        "        print(exc.name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ray", "torch"]
