"""The type stubs name every method the native module exposes."""

from __future__ import annotations

import ast
from pathlib import Path

from datasetrt import _native


def stub_members() -> dict[str, set[str]]:
    path = Path(__file__).resolve().parents[1] / "python" / "datasetrt" / "_native.pyi"
    tree = ast.parse(path.read_text())
    return {
        node.name: {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def test_every_native_class_and_method_has_a_stub():
    stubs = stub_members()
    for name in ("Dataset", "Loader", "CacheWriter", "TableProvider"):
        cls = getattr(_native, name)
        public = {m for m in vars(cls) if not m.startswith("_")}
        dunder = {
            m
            for m in ("__len__", "__iter__", "__next__", "__datafusion_table_provider__")
            if m in vars(cls)
        }
        assert name in stubs, f"no stub for class {name}"
        assert public | dunder <= stubs[name], (name, sorted((public | dunder) - stubs[name]))
