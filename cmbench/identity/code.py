"""What computed a record: CMBench's code, a plug-in's code, the backbone's files, the manifest, the scorer.

A run has two identities, kept apart on purpose (docs/runs.md):

- its **config** names the run directory (:func:`cmbench.spec.run_dir_for`): a different
  knob is a different run, and the folder is where a user keeps or deletes results;
- its **code** is stamped on every record (:func:`code_identity`: ``code`` with one hash per part,
  ``code_hash`` over them). A rerun recomputes every task whose record carries another ``code_hash``
  (``keep_other_code=true`` keeps them, and the run, ``summary.json`` and leaderboards say which).

The parts of the code identity:

``cmbench``
    CMBench's result-deciding modules (:data:`RESULT_CODE`), each parsed and dumped without
    docstrings, comments or layout, so editing a README, a docstring or a comment reruns nothing while
    any change to what the code does reruns everything. The rest of the package (:data:`HARNESS_CODE`:
    command line, reports, records, locks, ...) never changes a number.
``method``
    For a method defined outside CMBench (``_target_`` or an entry point): the module of its class, of
    every base class outside CMBench and the standard library, and every module those import from the
    plug-in's own folder (its top-level package, or the folder of a top-level module), transitively,
    normalised the same way. A class without a source file (defined in a notebook) is hashed from its
    source as ``inspect`` finds it, else from its functions' byte code. ``None`` for built-in methods.
``backbone``
    A plug-in backbone's sources (as for a method; none for CMBench's loaders) and a fingerprint of every
    file a backbone config value points at (e.g. the tiny model's ``path`` and ``head_map``, a real
    model's checkpoint folder), with the files beside a file that share its stem (the tiny model's
    ``.json`` config beside its ``.safetensors``). Files up to :data:`FULL_HASH_BYTES` are hashed
    whole (SHA-256); a larger file (multi-GB shards) by its size and the SHA-256 of
    :data:`SAMPLES` blocks of :data:`SAMPLE_BYTES` spread evenly over it, first and last included:
    cheap, and any re-saved or retrained checkpoint changes it, though an edit confined to bytes
    between the samples would not.
``manifest``
    SHA-256 of the dataset's manifest (the tasks, their references and prompts); the videos it names
    are not hashed.
``scorer``
    The scorer's own identities: its config hash (result config, version, precision) and its models'
    (:attr:`cmbench.scoring.pipeline.Scorer.models_hash`: weight and processor file contents or hub
    commits, the transformers version).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import marshal
import os
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cmbench.config_paths import PACKAGE_ROOT
from cmbench.hashing import file_hash, json_digest

RESULT_CODE = ("backbones", "cache", "data", "generation", "methods", "miniworld", "parallel", "scoring",
               "hashing.py", "runs/evaluator.py", "spec.py")
"""Package folders and modules whose code decides a record's numbers (paths relative to the package)."""

HARNESS_CODE = ("__init__.py", "__main__.py", "api.py", "benchmarks", "bounded_read.py", "calibration", "cli", "config_paths.py",
                "config_schema.py", "doc_examples.py", "errors.py", "identity", "lock.py", "method_check.py", "method_family.py",
                "paper", "provenance.py", "registry.py", "shipped.py",
                "report",
                "runs/__init__.py", "runs/atomic.py", "runs/experiment.py", "runs/output_folder.py", "runs/progress.py",
                "runs/ranks.py",
                "runs/records.py", "runs/runner.py", "runs/score_videos.py", "runs/summary.py", "runs/tracking.py")
"""The rest of the package: it selects, runs, stores and reports, and never changes a number.
(``calibration`` writes method configs and head maps; those are hashed as config and backbone files.)"""

FULL_HASH_BYTES = 64 << 20
SAMPLE_BYTES = 1 << 20
SAMPLES = 16
HASH_DIGITS = 16


def package_modules() -> list[str]:
    """Every ``.py`` file of the installed package, relative to it (``runs/evaluator.py``), sorted."""
    return sorted(p.relative_to(PACKAGE_ROOT).as_posix() for p in PACKAGE_ROOT.rglob("*.py"))


def code_role(module: str) -> str | None:
    """``"result"`` or ``"harness"`` for a package-relative module path, None when undeclared."""
    for role, entries in (("result", RESULT_CODE), ("harness", HARNESS_CODE)):
        if any(module == e or module.startswith(e.rstrip("/") + "/") for e in entries):
            return role
    return None


def normalised_source(source: str, where: str = "<source>") -> str:
    """What a Python source does: its syntax tree without docstrings (comments and layout are not in
    the tree), dumped as text. Source that does not parse is returned as is."""
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or ([] if isinstance(node, ast.Module) else [ast.Pass()])
    return ast.dump(tree)


@functools.lru_cache(maxsize=4096)
def _file_source_hash(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(normalised_source(Path(path).read_text(encoding="utf-8", errors="replace"),
                                            path).encode()).hexdigest()


def source_hash(paths: Iterable[Path], root: Path | None = None) -> str:
    """One hash over the normalised sources of ``paths``, each named relative to ``root`` (else by
    file name), so a moved checkout hashes the same."""
    digest = hashlib.sha256()
    for path in sorted(set(Path(p) for p in paths)):
        stat = path.stat()
        name = path.relative_to(root).as_posix() if root is not None and path.is_relative_to(root) else path.name
        digest.update(f"{name}\0{_file_source_hash(str(path), stat.st_mtime_ns, stat.st_size)}\0".encode())
    return digest.hexdigest()[:HASH_DIGITS]


def cmbench_code_hash() -> str:
    """The hash of CMBench's result-deciding modules (:data:`RESULT_CODE`)."""
    return source_hash([PACKAGE_ROOT / m for m in package_modules() if code_role(m) == "result"], PACKAGE_ROOT)


# ---------------------------------------------------------------------------------------- plug-ins
def _installed(path: Path) -> bool:
    """Whether a file belongs to Python's standard library or an installed distribution."""
    if any(part in ("site-packages", "dist-packages") for part in path.parts):
        return True
    paths = sysconfig.get_paths()
    return any(path.is_relative_to(Path(paths[k]).resolve()) for k in ("stdlib", "platstdlib") if k in paths)


def _plugin_module(module: ModuleType | None, own: bool) -> bool:
    """Whether ``module`` holds plug-in code to hash: not CMBench's, not built in, and (for base classes,
    ``own=False``) not the standard library or an installed library (a base class from ``torch``
    is not the plug-in's code; the plug-in class's own module is, wherever it is installed)."""
    if module is None or module.__name__ == "builtins":
        return False
    if module.__name__ == "cmbench" or module.__name__.startswith("cmbench."):
        return False
    file = getattr(module, "__file__", None)
    return own or file is None or not _installed(Path(file).resolve())


def _plugin_root(module: ModuleType) -> Path:
    """The folder a plug-in's own modules live in: its top-level package's, else its module's."""
    top = sys.modules.get(module.__name__.split(".")[0])
    top_paths = list(getattr(top, "__path__", []) or [])
    if top is not None and top_paths:
        return Path(top_paths[0]).resolve()
    return Path(str(module.__file__)).resolve().parent


def _imported_modules(path: Path, module_name: str) -> set[str]:
    """Names of the modules ``path`` imports (absolute, and relative ones resolved against its package)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return set()
    package = module_name if path.name == "__init__.py" else module_name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base = ".".join(parts[: len(parts) - node.level + 1]) if node.level <= len(parts) + 1 else ""
                stem = ".".join(p for p in (base, node.module or "") if p)
            else:
                stem = node.module or ""
            if stem:
                names.add(stem)
                names.update(f"{stem}.{alias.name}" for alias in node.names)
    return names


def _module_file(name: str) -> Path | None:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file and str(file).endswith(".py") else None


def plugin_sources(modules: Iterable[ModuleType]) -> list[Path]:
    """The source files of plug-in ``modules`` and of every module they import from their own
    folder, transitively (only modules already imported are followed)."""
    found: dict[Path, str] = {}
    todo: list[tuple[str, Path]] = []
    for module in modules:
        file = getattr(module, "__file__", None)
        if file and str(file).endswith(".py"):
            todo.append((module.__name__, _plugin_root(module)))
    while todo:
        name, root = todo.pop()
        path = _module_file(name)
        if path is None or path in found or not path.is_relative_to(root):
            continue
        found[path] = name
        todo.extend((imported, root) for imported in _imported_modules(path, name))
    return sorted(found)


def _object_source(obj: Any) -> str:
    """Source of a class or function without a file: ``inspect``'s, else its functions' byte code."""
    try:
        return normalised_source(inspect.getsource(obj))
    except (OSError, TypeError):
        pass
    members = vars(obj).values() if isinstance(obj, type) else [obj]
    codes = [getattr(getattr(m, "__func__", m), "__code__", None) for m in members]
    return hashlib.sha256(b"".join(marshal.dumps(c) for c in codes if c is not None)).hexdigest()


def plugin_code_hash(obj: Any) -> str | None:
    """The hash of the code behind a plug-in class or loader (see the module docstring), None when it
    is CMBench's own."""
    chain = obj.__mro__ if isinstance(obj, type) else (obj,)
    owners: list[tuple[Any, ModuleType]] = []
    for i, c in enumerate(chain):
        module = sys.modules.get(getattr(c, "__module__", "") or "")
        if module is not None and _plugin_module(module, own=i == 0):
            owners.append((c, module))
    if not owners:
        return None
    digest = hashlib.sha256(source_hash(plugin_sources(m for _, m in owners)).encode())
    for owner, module in owners:
        if not str(getattr(module, "__file__", None) or "").endswith(".py"):
            digest.update(_object_source(owner).encode())
    return digest.hexdigest()[:HASH_DIGITS]


# ---------------------------------------------------------------------------------------- files
def file_fingerprint(path: str | Path) -> str:
    """``sha256:<hex>`` of a file up to :data:`FULL_HASH_BYTES`; above, ``sampled:<size>:<hex>``: the
    SHA-256 of :data:`SAMPLES` blocks of :data:`SAMPLE_BYTES` at evenly spaced offsets (first and last
    block included)."""
    path = Path(path)
    size = path.stat().st_size
    if size <= FULL_HASH_BYTES:
        return f"sha256:{file_hash(path)}"
    digest = hashlib.sha256()
    step = (size - SAMPLE_BYTES) / (SAMPLES - 1)
    with open(path, "rb") as handle:
        for i in range(SAMPLES):
            handle.seek(round(i * step))
            digest.update(handle.read(SAMPLE_BYTES))
    return f"sampled:{size}:{digest.hexdigest()}"


def path_fingerprint(path: str | Path) -> str:
    """A file's fingerprint with those of the files beside it that share its stem, or a folder's:
    every file under it (hidden ones left out) by relative path and fingerprint; ``missing`` when
    nothing is there."""
    path = Path(path)
    if path.is_file():
        files = sorted(p for p in path.parent.glob(f"{path.stem}.*") if p.is_file() and p.stem == path.stem)
        base = path.parent
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        base = path
    else:
        return "missing"
    return json_digest({p.relative_to(base).as_posix(): file_fingerprint(p) for p in files})


def _path_values(value: Any, key: str = "") -> list[tuple[str, str]]:
    """``(key, value)`` of the string values of a (nested) config that look like paths (they contain a
    path separator) and name something on disk; nested keys are dotted (``components.vae``)."""
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _path_values(v, f"{key}.{k}" if key else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _path_values(v, f"{key}[{i}]")]
    if isinstance(value, str) and os.sep in value and Path(value).exists():
        return [(key, value)]
    return []


def backbone_files(backbone_cfg: Mapping[str, Any]) -> dict[str, str]:
    """``{config key: fingerprint}`` of every file or folder a backbone config points at (keyed by the
    config key, not the path: where the files are is the config's business, what they hold is this)."""
    return {k: path_fingerprint(p) for k, p in sorted(_path_values(backbone_cfg))}


# ---------------------------------------------------------------------------------------- identity
@dataclass(frozen=True)
class CodeIdentity:
    """The code identity of a run (see the module docstring).

    Attributes
    ----------
    parts : dict
        ``{"cmbench", "method", "backbone", "manifest", "scorer"}``: one short hash per part
        (``method``: None for built-in methods).
    hash : str
        The hash over ``parts``: a record's ``code_hash``.
    """

    parts: dict[str, str | None]
    hash: str


def code_identity(method_cls: type, backbone_cfg: Mapping[str, Any], manifest: str | Path | None,
                  scorer_hash: str | None = None) -> CodeIdentity:
    """The code identity of a run of ``method_cls`` on a backbone config and a manifest file, scored
    by the scorer ``scorer_hash``.

    Parameters
    ----------
    method_cls : type
        The method's class (a :class:`cmbench.methods.base.Method` subclass).
    backbone_cfg : mapping
        The resolved backbone config (its ``_target_`` and the files it names).
    manifest : path or None
    scorer_hash : str, optional
    """
    from cmbench.registry import import_object

    target = backbone_cfg.get("_target_")
    loader = import_object(str(target)) if target else None
    loader_owner = getattr(loader, "__self__", loader)  # a classmethod loader: its class
    backbone = {"code": plugin_code_hash(loader_owner) if loader_owner is not None else None,
                "files": backbone_files(backbone_cfg)}
    parts: dict[str, str | None] = {
        "cmbench": cmbench_code_hash(),
        "method": plugin_code_hash(method_cls),
        "backbone": json_digest(backbone)[:HASH_DIGITS],
        "manifest": file_hash(manifest)[:HASH_DIGITS] if manifest is not None and Path(manifest).is_file() else None,
        "scorer": scorer_hash,
    }
    return CodeIdentity(parts, json_digest(parts)[:12])


def changed_parts(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """Which parts of a code identity differ (``["method"]``); every part for a record without one."""
    if not old:
        return ["unknown (a record from before code identities)"]
    return [k for k in new if old.get(k) != new.get(k)]


def describe_changes(parts: Iterable[str]) -> str:
    """Words for :func:`changed_parts`: ``method source, backbone files``."""
    words = {"cmbench": "CMBench code", "method": "method source", "backbone": "backbone code or files",
             "manifest": "manifest", "scorer": "scorer"}
    return ", ".join(words.get(p, p) for p in parts)


def portable(value: Any) -> Any:
    """``value`` with paths inside the installed package written as ``${package_root:}/...``, so a
    config's identity does not depend on where CMBench is installed."""
    root = str(PACKAGE_ROOT)
    if isinstance(value, Mapping):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str) and (value == root or value.startswith(root + os.sep)):
        return "${package_root:}" + value[len(root):]
    return value

