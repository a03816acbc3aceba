"""The pieces of a run's code identity, one at a time: which files and modules count, how they are named and
hashed, and what a record's ``code`` holds. Expected values are worked out from the documented formats
(SHA-256 of bytes, ``json_digest`` of named parts), so a change to any of them shows up here before it
silently reruns (or, worse, silently keeps) every stored record."""

from __future__ import annotations

import ast
import hashlib
import importlib
import marshal
import os
import sys
import sysconfig
import textwrap
import types
from pathlib import Path

import pytest

from cmbench.hashing import json_digest
from cmbench.identity import code as identity


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Plug-in code on disk: ``src/`` (the user's own folders) and ``site-packages/`` (an installed library)
    are both importable; ``write`` puts files there (paths relative to the temporary folder) and ``load``
    imports a module afresh. Every module from these folders is forgotten afterwards."""
    root = tmp_path.resolve()
    for folder in ("src", "site-packages"):
        (root / folder).mkdir()
        monkeypatch.syspath_prepend(str(root / folder))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def forget():
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and Path(file).resolve().is_relative_to(root):
                del sys.modules[name]

    def write(files: dict[str, str]) -> None:
        for rel, text in files.items():
            _write(root / rel, text)
        forget()
        importlib.invalidate_caches()

    def load(name: str) -> types.ModuleType:
        return importlib.import_module(name)

    yield types.SimpleNamespace(root=root, write=write, load=load)
    forget()


# ------------------------------------------------------------------------------------ which code counts
def test_a_folder_entry_written_with_a_trailing_slash_covers_the_modules_inside_it(monkeypatch):
    """``kernels/`` and ``kernels`` declare the same folder; a folder whose name merely starts the same
    (``kernels_old/``) is not covered."""
    monkeypatch.setattr(identity, "RESULT_CODE", ("kernels/", "MLX/"))
    monkeypatch.setattr(identity, "HARNESS_CODE", ("cli",))
    assert identity.code_role("kernels/attn.py") == "result"
    assert identity.code_role("MLX/ops.py") == "result"
    assert identity.code_role("kernels_old/attn.py") is None
    assert identity.code_role("cli/run.py") == "harness"
    assert identity.code_role("tools/x.py") is None


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A stand-in for the installed package: a result folder (``cache``), a result module (``hashing.py``),
    a harness folder (``cli``) and an empty result folder (``data``) to move modules into."""
    pkg = tmp_path / "pkg"
    _write(pkg / "cache" / "a.py", "X = 1\n")
    _write(pkg / "hashing.py", "Z = 1\n")
    _write(pkg / "cli" / "b.py", "Y = 1\n")
    (pkg / "data").mkdir()
    monkeypatch.setattr(identity, "PACKAGE_ROOT", pkg)
    return pkg


def test_cmbench_code_hash_covers_the_result_modules_by_their_place_in_the_package(fake_package):
    """A result module's code and its place in the package change the hash; a harness module never does."""
    pkg = fake_package
    first = identity.cmbench_code_hash()
    assert first == identity.source_hash([pkg / "cache" / "a.py", pkg / "hashing.py"], pkg)
    _write(pkg / "cli" / "b.py", "Y = 22\n")  # the command line changed: no number can change
    assert identity.cmbench_code_hash() == first
    (pkg / "cache" / "a.py").rename(pkg / "data" / "a.py")  # same code, now another module
    moved = identity.cmbench_code_hash()
    assert moved != first
    _write(pkg / "data" / "a.py", "X = 22\n")
    assert identity.cmbench_code_hash() not in (first, moved)


# ------------------------------------------------------------------------------------ normalised sources
@pytest.mark.parametrize("with_docstring, without", [
    ('def f(x):\n    """Only a docstring."""\n', "def f(x):\n    pass\n"),
    ('class C:\n    """Only a docstring."""\n', "class C:\n    pass\n"),
    ('async def f():\n    """Only a docstring."""\n', "async def f():\n    pass\n"),
])
def test_a_body_that_was_only_a_docstring_is_the_same_as_pass(with_docstring, without):
    """Dropping the docstring leaves a function or class that still parses: the same code as ``pass``."""
    assert identity.normalised_source(with_docstring) == identity.normalised_source(without)
    assert "Pass()" in identity.normalised_source(with_docstring)


def test_a_warning_about_a_source_names_the_file_it_came_from():
    """Python's warnings while reading a plug-in's source (an invalid escape) point at that file."""
    with pytest.warns((DeprecationWarning, SyntaxWarning)) as named:
        identity.normalised_source('x = "\\d"\n', "plugin.py")
    assert named[0].filename == "plugin.py"
    with pytest.warns((DeprecationWarning, SyntaxWarning)) as unnamed:
        identity.normalised_source('x = "\\d"\n')
    assert unnamed[0].filename == "<source>"


def test_source_that_does_not_parse_is_hashed_as_written():
    assert identity.normalised_source("def broken(:\n") == "def broken(:\n"


# ------------------------------------------------------------------------------------ source hashes
def test_a_source_is_named_by_its_path_under_the_root_so_a_moved_checkout_hashes_the_same(tmp_path):
    """``sha256("<name>\\0<sha256 of the normalised source>\\0" ...)``, 16 digits: under a root the name is
    the relative path (``cache/x.py``); without one, the file name."""
    one = _write(tmp_path / "one" / "cache" / "x.py", "A = 1\n")
    moved = _write(tmp_path / "moved" / "cache" / "x.py", "A = 1\n")
    other = _write(tmp_path / "other" / "data" / "x.py", "A = 1\n")
    code = _sha(ast.dump(ast.parse("A = 1\n")).encode())
    assert identity.source_hash([one], tmp_path / "one") == _sha(f"cache/x.py\0{code}\0".encode())[:16]
    assert identity.source_hash([moved], tmp_path / "moved") == identity.source_hash([one], tmp_path / "one")
    assert identity.source_hash([other], tmp_path / "other") != identity.source_hash([one], tmp_path / "one")
    assert identity.source_hash([one]) == identity.source_hash([other]) == _sha(f"x.py\0{code}\0".encode())[:16]


def test_a_source_rewritten_within_the_same_clock_tick_is_hashed_again(tmp_path):
    """The cache of normalised sources is keyed by modification time *and* size, so an edit that keeps the
    modification time (a coarse file system clock, a restored timestamp) is still seen."""
    path = _write(tmp_path / "m.py", "A = 1\n")
    before = identity.source_hash([path])
    mtime = path.stat().st_mtime_ns
    _write(path, "A = 10\n")
    os.utime(path, ns=(mtime, mtime))
    assert identity.source_hash([path]) != before


# ------------------------------------------------------------------------------------ plug-in modules
@pytest.mark.parametrize("where, installed", [
    (lambda tmp: Path("/opt/env/lib/python3/site-packages/torch/nn/modules/module.py"), True),
    (lambda tmp: Path("/usr/lib/python3/dist-packages/numpy/core.py"), True),
    (lambda tmp: Path(sysconfig.get_paths()["stdlib"]).resolve() / "json" / "__init__.py", True),
    (lambda tmp: Path(sysconfig.get_paths()["platstdlib"]).resolve() / "lib-dynload" / "x.py", True),
    (lambda tmp: tmp / "mymethods" / "press.py", False),
])
def test_installed_means_the_standard_library_or_an_installed_distribution(tmp_path, where, installed):
    assert identity._installed(where(tmp_path)) is installed


def test_which_modules_hold_plugin_code(plugins):
    """Not CMBench's, not built in; a base class's module only when it is not the standard library or an
    installed library; the plug-in class's own module wherever it is (installed or from a notebook)."""
    plugins.write({"src/mine.py": "X = 1\n"})
    mine = plugins.load("mine")
    notebook = types.ModuleType("notebook_cell")
    json_module = importlib.import_module("json")
    assert identity._plugin_module(None, own=True) is False
    assert identity._plugin_module(sys.modules["builtins"], own=True) is False
    assert identity._plugin_module(sys.modules["cmbench"], own=True) is False
    assert identity._plugin_module(sys.modules["cmbench.identity.code"], own=True) is False
    assert identity._plugin_module(json_module, own=False) is False  # a base class from the standard library
    assert identity._plugin_module(json_module, own=True) is True
    assert identity._plugin_module(mine, own=False) is True
    assert identity._plugin_module(notebook, own=False) is True


def test_a_plugins_own_folder_is_its_top_level_packages_or_its_modules(plugins):
    plugins.write({"src/deep/__init__.py": "", "src/deep/sub/__init__.py": "", "src/deep/sub/leaf.py": "X = 1\n",
                   "src/single.py": "X = 1\n"})
    assert identity._plugin_root(plugins.load("deep.sub.leaf")) == plugins.root / "src" / "deep"
    assert identity._plugin_root(plugins.load("single")) == plugins.root / "src"


def test_imports_are_named_absolutely_with_relative_ones_resolved_against_the_package(tmp_path):
    source = """\
        import a.b, c
        from . import x
        from ..util import y
        from ...top import z
        from .... import w
        from e.f import g
    """
    module = _write(tmp_path / "pkg" / "sub" / "mod.py", source)
    assert identity._imported_modules(module, "pkg.sub.mod") == {
        "a.b", "c", "pkg.sub", "pkg.sub.x", "pkg.util", "pkg.util.y", "top", "top.z", "e.f", "e.f.g"}
    init = _write(tmp_path / "pkg" / "sub" / "__init__.py", "from . import x\n")  # a package is its own package
    assert identity._imported_modules(init, "pkg.sub") == {"pkg.sub", "pkg.sub.x"}
    single = _write(tmp_path / "single.py", "from .helper import f\n")
    assert identity._imported_modules(single, "single") == {"helper", "helper.f"}
    broken = _write(tmp_path / "broken.py", "import (\n")
    assert identity._imported_modules(broken, "broken") == set()


class _LocalePath(type(Path())):
    """A path read as on a machine whose locale encoding is cp1252 (Windows) when no encoding is given."""

    def read_text(self, encoding=None, errors=None):
        return self.read_bytes().decode(encoding or "cp1252", errors or "strict")


def test_plugin_sources_are_read_as_utf8_whatever_the_locale_and_bad_bytes_do_not_stop_them(tmp_path):
    utf8 = _write(tmp_path / "accents.py", "import café\n".encode())
    assert identity._imported_modules(_LocalePath(utf8), "accents") == {"café"}
    latin = _write(tmp_path / "latin.py", b"# caf\xe9 (latin-1)\nimport helper\n")
    assert identity._imported_modules(_LocalePath(latin), "latin") == {"helper"}


def test_only_modules_with_a_python_file_have_a_source_file(tmp_path, monkeypatch):
    compiled = types.ModuleType("compiled_ext")
    compiled.__file__ = str(tmp_path / "compiled_ext.cpython-311-x86_64-linux-gnu.so")
    source = types.ModuleType("source_mod")
    source.__file__ = str(tmp_path / "source_mod.py")
    monkeypatch.setitem(sys.modules, "compiled_ext", compiled)
    monkeypatch.setitem(sys.modules, "source_mod", source)
    assert identity._module_file("compiled_ext") is None
    assert identity._module_file("source_mod") == (tmp_path / "source_mod.py").resolve()
    assert identity._module_file("never_imported_module") is None


def test_a_plugins_sources_stay_inside_its_own_folder(plugins):
    """The standard library and another folder's modules it imports are not the plug-in's code; its own
    package's ``__init__`` is (``from mypress import helper`` imports it)."""
    plugins.write({
        "src/mypress/__init__.py": "",
        "src/mypress/press.py": "import json\nimport textwrap\nimport otherpkg.util\nfrom mypress import helper\n",
        "src/mypress/helper.py": "X = 1\n",
        "src/otherpkg/__init__.py": "",
        "src/otherpkg/util.py": "Y = 1\n",
    })
    press = plugins.load("mypress.press")
    src = plugins.root / "src"
    assert identity.plugin_sources([press]) == [src / "mypress" / name for name in ("__init__.py", "helper.py", "press.py")]


# ------------------------------------------------------------------------------------ code without a file
def _sample(x):
    """A function with a source file."""
    return x + 1


def _without_source(text: str, name: str):
    namespace: dict = {}
    exec(textwrap.dedent(text), namespace)
    return namespace[name]


def test_code_with_a_source_is_hashed_from_its_normalised_source():
    assert identity._object_source(_sample).startswith("Module(body=[FunctionDef(name='_sample'")


def test_code_without_a_source_is_hashed_from_its_byte_code_classmethods_and_staticmethods_included():
    """SHA-256 of the marshalled code objects in definition order (a lone function: its own)."""
    fn = _without_source("def f(x):\n    return x + 1\n", "f")
    assert identity._object_source(fn) == _sha(marshal.dumps(fn.__code__))
    cls_text = """\
        class C:
            def f(self):
                return 1
            @classmethod
            def g(cls):
                return 2
            @staticmethod
            def h():
                return 3
    """
    cls = _without_source(cls_text, "C")
    codes = [cls.f.__code__, cls.g.__code__, cls.h.__code__]
    assert identity._object_source(cls) == _sha(b"".join(marshal.dumps(c) for c in codes))
    assert identity._object_source(_without_source(cls_text.replace("return 2", "return 5"), "C")) != \
        identity._object_source(cls)  # a classmethod's code counts
    assert identity._object_source(_without_source(cls_text.replace("return 3", "return 5"), "C")) != \
        identity._object_source(cls)  # and a staticmethod's


# ------------------------------------------------------------------------------------ plug-in code hashes
PLUGIN_FILES = {
    "src/shared_bases/__init__.py": "class Base:\n    pass\n",
    "src/mypress/__init__.py": "",
    "src/mypress/press.py": """\
        from shared_bases import Base
        from fakelib import Library


        class Press(Base):
            gamma = 0.1


        class Plain:
            gamma = 0.1


        class OnLibrary(Library):
            gamma = 0.1


        def load():
            return None


        def load_other():
            return None
    """,
    "site-packages/fakelib/__init__.py": "class Library:\n    pass\n",
    "site-packages/instpress/__init__.py": "class Installed:\n    gamma = 0.1\n",
}


def test_a_file_backed_plugin_is_hashed_from_its_sources_only(plugins):
    """``sha256(source_hash(plugin sources))``, 16 digits; functions are hashed like classes."""
    plugins.write(PLUGIN_FILES)
    mod = plugins.load("mypress.press")
    expected = _sha(identity.source_hash(identity.plugin_sources([mod])).encode())[:16]
    assert identity.plugin_code_hash(mod.Plain) == expected
    assert identity.plugin_code_hash(mod.load) == identity.plugin_code_hash(mod.load_other) == expected
    assert identity.plugin_code_hash(types.ModuleType("loose")) is None  # names no module of its own


def test_a_plugin_base_class_from_another_folder_counts_and_one_from_an_installed_library_does_not(plugins):
    plugins.write(PLUGIN_FILES)
    press, on_library = identity.plugin_code_hash(plugins.load("mypress.press").Press), \
        identity.plugin_code_hash(plugins.load("mypress.press").OnLibrary)
    plugins.write({"src/shared_bases/__init__.py": "class Base:\n    gamma = 0.3\n"})
    assert identity.plugin_code_hash(plugins.load("mypress.press").Press) != press
    plugins.write({"site-packages/fakelib/__init__.py": "class Library:\n    gamma = 0.3\n"})  # upgraded
    assert identity.plugin_code_hash(plugins.load("mypress.press").OnLibrary) == on_library


def test_a_plugin_class_installed_as_a_distribution_is_still_the_plugins_code(plugins):
    plugins.write(PLUGIN_FILES)
    first = identity.plugin_code_hash(plugins.load("instpress").Installed)
    assert first is not None
    plugins.write({"site-packages/instpress/__init__.py": "class Installed:\n    gamma = 0.2\n"})
    assert identity.plugin_code_hash(plugins.load("instpress").Installed) != first


# ------------------------------------------------------------------------------------ files
def test_a_file_of_exactly_the_full_hash_size_is_hashed_whole_and_one_byte_more_is_sampled(tmp_path, monkeypatch):
    """1025 bytes, 4 blocks of 100: offsets round(i * 925 / 3) = 0, 308, 617, 925 (the last block ends the file)."""
    monkeypatch.setattr(identity, "FULL_HASH_BYTES", 1024)
    monkeypatch.setattr(identity, "SAMPLE_BYTES", 100)
    monkeypatch.setattr(identity, "SAMPLES", 4)
    data = bytes(range(256)) * 4
    path = _write(tmp_path / "w.bin", data)
    assert identity.file_fingerprint(path) == f"sha256:{_sha(data)}"
    data += b"!"
    _write(path, data)
    blocks = data[0:100] + data[308:408] + data[617:717] + data[925:1025]
    assert identity.file_fingerprint(path) == f"sampled:1025:{_sha(blocks)}"


def test_a_file_is_fingerprinted_with_its_same_stem_files_not_a_same_stem_folder(tmp_path):
    weights = _write(tmp_path / "model.safetensors", b"weights")
    _write(tmp_path / "model.json", b"{}")
    _write(tmp_path / "model.cache" / "x.bin", b"cache")  # a folder beside it
    _write(tmp_path / "model.tar.gz", b"archive")  # stem "model.tar"
    assert identity.path_fingerprint(weights) == json_digest(
        {"model.json": f"sha256:{_sha(b'{}')}", "model.safetensors": f"sha256:{_sha(b'weights')}"})


def test_a_folder_is_fingerprinted_by_its_visible_files_at_every_depth(tmp_path):
    folder = tmp_path / "ckpt"
    _write(folder / "a.bin", b"a")
    _write(folder / "sub" / "b.bin", b"b")
    _write(folder / ".git" / "config", b"hidden")
    _write(folder / ".lock", b"hidden")
    assert identity.path_fingerprint(folder) == json_digest(
        {"a.bin": f"sha256:{_sha(b'a')}", "sub/b.bin": f"sha256:{_sha(b'b')}"})


def test_paths_in_config_lists_are_keyed_by_their_index(tmp_path):
    one, two = _write(tmp_path / "s1.bin", b"1"), _write(tmp_path / "s2.bin", b"2")
    cfg = {"shards": [str(one), str(two)], "pair": ("bf16", str(one)), "gone": [str(tmp_path / "absent.bin")]}
    assert identity.backbone_files(cfg) == {
        "pair[1]": json_digest({"s1.bin": f"sha256:{_sha(b'1')}"}),
        "shards[0]": json_digest({"s1.bin": f"sha256:{_sha(b'1')}"}),
        "shards[1]": json_digest({"s2.bin": f"sha256:{_sha(b'2')}"}),
    }


# ------------------------------------------------------------------------------------ the identity
BACKBONE_FILES = {
    "src/mybackbone/__init__.py": """\
        from shared_bases import Base


        class Loader(Base):
            @classmethod
            def load(cls, **kwargs):
                return None


        def load_plain(**kwargs):
            return None
    """,
    "src/mymethod/__init__.py": "class Press:\n    gamma = 0.1\n",
    "src/shared_bases/__init__.py": "class Base:\n    pass\n",
}


def _backbone_part(code: str | None, files: dict) -> str:
    return json_digest({"code": code, "files": files})[:16]


def test_a_code_identity_names_its_five_parts_and_hashes_them(plugins):
    """``backbone`` is ``json_digest({"code", "files"})`` (16 digits), ``manifest`` the manifest's SHA-256
    (16 digits), ``scorer`` as given, and the record's ``code_hash`` ``json_digest(parts)`` (12 digits)."""
    plugins.write(BACKBONE_FILES)
    weights = _write(plugins.root / "w" / "model.bin", b"weights")
    manifest = _write(plugins.root / "manifest.jsonl", b'{"task": 1}\n')
    press = plugins.load("mymethod").Press
    loader = plugins.load("mybackbone").Loader
    cfg = {"_target_": "mybackbone.Loader.load", "path": str(weights)}
    got = identity.code_identity(press, cfg, manifest, "scorer123")
    assert got.parts == {
        "cmbench": identity.cmbench_code_hash(),
        "method": identity.plugin_code_hash(press),
        "backbone": _backbone_part(identity.plugin_code_hash(loader),
                                   {"path": json_digest({"model.bin": f"sha256:{_sha(b'weights')}"})}),
        "manifest": _sha(b'{"task": 1}\n')[:16],
        "scorer": "scorer123",
    }
    assert None not in (got.parts["method"], identity.plugin_code_hash(loader))
    assert got.hash == json_digest(got.parts)[:12]


def test_a_classmethod_loader_is_hashed_as_its_class_with_its_bases(plugins):
    """``Loader.load`` stands for ``Loader``: a change to its base class (in another folder) is a change."""
    plugins.write(BACKBONE_FILES)
    cfg = {"_target_": "mybackbone.Loader.load"}
    first = identity.code_identity(plugins.load("mymethod").Press, cfg, None).parts["backbone"]
    plugins.write({"src/shared_bases/__init__.py": "class Base:\n    size = 2\n"})
    assert identity.code_identity(plugins.load("mymethod").Press, cfg, None).parts["backbone"] != first


def test_a_function_loader_is_hashed_and_a_builtin_backbone_has_no_plugin_code(plugins):
    plugins.write(BACKBONE_FILES)
    press = plugins.load("mymethod").Press
    plain = identity.code_identity(press, {"_target_": "mybackbone.load_plain"}, None)
    assert plain.parts["backbone"] == _backbone_part(identity.plugin_code_hash(plugins.load("mybackbone").load_plain), {})
    assert identity.code_identity(press, {"device": "cpu"}, None).parts["backbone"] == _backbone_part(None, {})
    builtin = identity.code_identity(press, {"_target_": "cmbench.hashing.json_digest"}, None)
    assert builtin.parts["backbone"] == _backbone_part(None, {})


def test_a_missing_manifest_has_no_hash(plugins, tmp_path):
    plugins.write(BACKBONE_FILES)
    press = plugins.load("mymethod").Press
    assert identity.code_identity(press, {}, None).parts["manifest"] is None
    assert identity.code_identity(press, {}, tmp_path / "absent.jsonl").parts["manifest"] is None
    assert identity.code_identity(press, {}, tmp_path).parts["manifest"] is None  # a folder is no manifest


# ------------------------------------------------------------------------------------ what changed
def test_changed_parts_lists_the_parts_that_differ_in_the_new_identitys_order():
    old = {"cmbench": "a", "method": None, "backbone": "b", "manifest": "m", "scorer": "s"}
    assert identity.changed_parts(old, dict(old)) == []
    new = {**old, "scorer": "t", "method": "p", "cmbench": "a"}
    assert identity.changed_parts(old, new) == ["method", "scorer"]
    assert identity.changed_parts({"cmbench": "a", "gone": 1}, {"cmbench": "a"}) == []


@pytest.mark.parametrize("old", [None, {}])
def test_a_record_without_a_code_identity_counts_as_all_changed(old):
    assert identity.changed_parts(old, {"cmbench": "a"}) == ["unknown (a record from before code identities)"]


def test_changes_are_described_in_words_in_the_given_order():
    parts = ["scorer", "method", "backbone", "cmbench", "manifest", "unknown (a record from before code identities)"]
    assert identity.describe_changes(parts) == ("scorer, method source, backbone code or files, CMBench code, "
                                                "manifest, unknown (a record from before code identities)")
    assert identity.describe_changes([]) == ""
