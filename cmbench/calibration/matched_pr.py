"""Calibrate a method's own knob to a target pruning ratio on calibration contexts, once, and keep it.

:func:`calibrate_method` finds the value of the method's declared knob (:attr:`Method.knob`:
DeCoPrune's gamma, TempDiff's and ForcingKV's ``k``, Streaming's ``recent_chunks``) whose mean PR on
the calibration tasks (:mod:`cmbench.calibration.pruning_ratio`) is within ``tolerance`` of the target
(:func:`cmbench.calibration.knob_search.search_knob`), and writes into ``<out_dir>/calibration/``:

- ``method/<method>_pr<target>.yaml``: the method config with the found knob, a Hydra option of the
  ``method`` group once the folder is on ``CMBENCH_CONFIG_PATH`` (``method=<method>_pr<target>``);
- ``<method>_pr<target>.json``: the knob, the found value, its calibration PR, every probe (value,
  PR) in order, the calibration data and tasks, the code identity and the key of the calibration;
- ``keyed/<method>_pr<target>_<key>.json``: the same log under its key, one per calibration setting,
  so a folder keeps every setting's calibration to a target (a sweep over probe steps at PR 0.85)
  while the two files above name the one last found or reused.

The method then runs with its own rule, decided once per chunk, at that knob (unlike quota mode,
``quota_pr`` / ``quota_tokens``, which overrides the rule); ``method.target_pr=p`` on a run does all
this itself (:mod:`cmbench.calibration.target_pr`). A calibration whose key (method setting, target, tolerance, calibration
data and tasks, backbone, generation, seed, code identity) matches the JSON's is reused, not redone; one
that does not (another setting gives another knob value) is made again, saying which settings differ from
the last calibration to that target (the log keeps them by the keys a user sets: ``setting``).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cmbench import bounded_read
from cmbench.calibration.knob_search import search_knob
from cmbench.calibration.pruning_ratio import (PRMeter, calibration_cache_dtype, calibration_config, calibration_storage,
                                               calibration_tasks, knob_value)
from cmbench.calibration.score_guess import ScoreGuess, records_scores
from cmbench.calibration.target_quantity import BYTES, NAMED, PR, TargetQuantity, check_bytes_floor
from cmbench.config_paths import to_dict
from cmbench.errors import ConfigError, some
from cmbench.hashing import config_hash
from cmbench.lock import RunLock
from cmbench.methods.base import Method
from cmbench.methods.knobs import Knob
from cmbench.runs import atomic
from cmbench.runs.output_folder import Legacy, OutputFolder, OutputFolderError, claim
from cmbench.methods.registry import build_method, canonical_method_config, config_class, method_names
from cmbench.identity.code import code_identity, file_fingerprint, portable
from cmbench.identity.labels import resolve_method_class, storage_suffix
from cmbench.identity.paths import path_component
from cmbench.spec import check_format_for_method

CALIBRATION_DIR = "calibration"


def pr_tag(target_pr: float, quantity: TargetQuantity = PR) -> str:
    """``0.85 -> "pr85"``, ``0.875 -> "pr87.5"`` (a bytes target: ``0.15 -> "bytes15"``): the target in a
    file name and a label."""
    return quantity.tag(target_pr)


def calibration_options(cfg: DictConfig) -> dict[str, float | int]:
    """``tolerance``, ``n_tasks`` and ``max_probes`` from ``cfg.calibration``, checked.

    Raises
    ------
    ConfigError
        One line naming the knob and what is expected.
    """
    c = cfg.calibration
    tasks, probes, tol = c.tasks, c.max_probes, c.tolerance
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise ConfigError(f"calibration.tasks={tasks!r}: expected a positive number of calibration tasks")
    if isinstance(probes, bool) or not isinstance(probes, int) or probes < 2:
        raise ConfigError(f"calibration.max_probes={probes!r}: expected a whole number >= 2 (both ends of the range)")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
        raise ConfigError(f"calibration.tolerance={tol!r}: expected a PR difference in (0, 1), e.g. 0.005")
    return {"tolerance": float(tol), "n_tasks": tasks, "max_probes": probes}


def method_knob(method_cfg: dict[str, Any]) -> Knob:
    """The knob :func:`calibrate_method` searches for ``method_cfg``'s class.

    Raises
    ------
    ConfigError
        The method declares none (FullKV, DummyForcing), or the config is in quota mode.
    """
    cls = config_class(method_cfg)
    name = cls.name or cls.__qualname__
    if cls.knob is None:
        with_knob = [n for n in method_names() if config_class({"name": n}).knob is not None]
        raise ConfigError(f"method {name!r} declares no knob that sets its pruning ratio (its class's `knob` is None: "
                          f"what it keeps is fixed by its rule), so there is nothing to calibrate; methods with one: "
                          f"{', '.join(with_knob)}")
    quota = [k for k in ("quota_pr", "quota_tokens", "target_pr") if method_cfg.get(k) is not None]
    if quota and quota[0] == "target_pr":
        raise ConfigError(f"method {name!r}: method.target_pr={method_cfg['target_pr']} asks for the calibration this "
                          f"command makes: give the target as target_pr={method_cfg['target_pr']} and drop method.target_pr")
    if quota:
        raise ConfigError(f"method {name!r}: method.{quota[0]}={method_cfg[quota[0]]} puts it in quota mode, which "
                          f"replaces its own rule; calibrate searches its own knob ({cls.knob.name}): drop "
                          f"method.{quota[0]}")
    return cls.knob


@dataclass
class Calibration:
    """The outcome of :func:`calibrate_method` (also the content of its JSON log).

    Attributes
    ----------
    method : str
        The method's name.
    label : str
        ``<method>@pr<target>``, the label runs with the found knob get.
    knob : str
    value : float or int
        The found knob value.
    calibration_pr : float
        Its mean PR on the calibration tasks.
    target_pr, tolerance : float
    within_tolerance : bool
    note : str
        What to know about the result (an integer knob that cannot land within the tolerance says so).
    probes : list of [value, PR]
        Every measurement made for this target, in order.
    data : dict
        The calibration data: ``root``, ``world_seed`` (MiniWorld), ``task_ids``.
    code : dict
        The code identity parts (method, CMBench, backbone, manifest).
    key : str
        Hash of everything that decides the result; a rerun with the same key reuses the JSON.
    yaml, log : str
        The written method config and this log.
    probe_key : str
        Hash of what decides a probe's PR (``key`` without the target, tolerance and probe limit):
        calibrations of one method to other targets with this key share their probes.
    reused_probes : list of [value, PR]
        Probes of those other calibrations the search started from (not measured again).
    cached : bool
        Read from an earlier calibration, not measured now (not written into the log).
    written : list of str
        The files this call wrote (the yaml, the log named after the target, the log under its key): a
        reused calibration whose files are already its own writes none (not written into the log).
    setting : dict
        What decided ``key`` besides the code and the target, flat by the keys a user sets
        (``calibration.tasks``, ``method.<knob>``, ``backbone.<key>``, ...): the next calibration to the
        target that is not this one names what differs (:func:`not_reused`). Not compared: the key is.
    quantity : {"pr", "bytes"}
        What the knob was calibrated to (:mod:`cmbench.calibration.target_quantity`): ``bytes``, the
        device bytes of the KV cache over FullKV's; ``target_pr`` and ``calibration_pr`` are then that
        ratio (the target and what the knob gave), and the probes the share of FullKV's bytes saved.
    """

    method: str
    label: str
    knob: str
    value: float | int
    calibration_pr: float
    target_pr: float
    tolerance: float
    within_tolerance: bool
    note: str
    probes: list[list[float]]
    data: dict[str, Any]
    code: dict[str, Any]
    key: str
    yaml: str
    log: str
    probe_key: str = ""
    reused_probes: list[list[float]] = field(default_factory=list)
    cached: bool = field(default=False, compare=False)
    setting: dict[str, Any] = field(default_factory=dict, compare=False)
    quantity: str = "pr"
    written: list[str] = field(default_factory=list, compare=False)

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k not in _NOT_LOGGED}, indent=2) + "\n"


_NOT_LOGGED = ("cached", "written")


KEYED_DIR = "keyed"


def calibration_paths(out_dir: str | Path, method: str, target_pr: float,
                      quantity: TargetQuantity = PR) -> tuple[Path, Path]:
    """``(<out_dir>/calibration/method/<method>_pr<t>.yaml, <out_dir>/calibration/<method>_pr<t>.json)``:
    the calibration of ``method`` to ``target_pr`` last found or reused in ``out_dir``."""
    base = Path(out_dir) / CALIBRATION_DIR
    stem = f"{path_component(method, 'method.name')}_{pr_tag(target_pr, quantity)}"
    return base / "method" / f"{stem}.yaml", base / f"{stem}.json"


def keyed_log_path(log_path: Path, key: str) -> Path:
    """Where the log at ``log_path`` (:func:`calibration_paths`) is kept under its calibration ``key``:
    ``<folder>/keyed/<method>_pr<t>_<key>.json``."""
    return log_path.parent / KEYED_DIR / f"{log_path.stem}_{key}.json"


def _note(knob: Knob, value: float, pr: float, target: float, tolerance: float,
          probes: list[tuple[float, float]], quantity: TargetQuantity = PR) -> str:
    """Why the search ended off target (``pr``, ``target`` and the probes in searched terms), or ""."""
    if abs(pr - target) <= tolerance:
        return ""
    if knob.integer:
        near = sorted({v for v, _ in probes if abs(v - value) == 1})
        others = ", ".join(f"{knob.name}={int(v)}: {quantity.text(p)}" for v, p in probes if v in near)
        return (f"{knob.name} takes whole values and none lands within {tolerance:.4f} of {quantity.text(target)}: "
                f"{knob.name}={int(value)} gives the nearest achievable {quantity.text(pr)}"
                + (f" ({others})" if others else ""))
    return (f"the search stopped after {len(probes)} probes at {quantity.text(pr)}, {abs(pr - target):.4f} "
            f"from the target")


def probes_path(folder: Path, method: str, probe_key: str) -> Path:
    """``<folder>/keyed/<method>_probes_<probe_key>.json``: every probe measured for ``method`` under
    ``probe_key``, by any calibration (a search that ended without a value too)."""
    return folder / KEYED_DIR / f"{path_component(method, 'method.name')}_probes_{probe_key}.json"


def keep_probe(folder: Path, method: str, probe_key: str, value: float, pr: float) -> None:
    """Add one measured probe to :func:`probes_path` (merged with what is there: a cache, so a probe lost
    to a concurrent writer is only measured again)."""
    path = probes_path(folder, method, probe_key)
    known = shared_probes(folder, method, probe_key, logs=False)
    known[float(value)] = float(pr)
    _write(path, json.dumps({"method": method, "probe_key": probe_key, "probes": sorted(map(list, known.items()))},
                            indent=2) + "\n")


def shared_probes(folder: Path, method: str, probe_key: str, logs: bool = True) -> dict[float, float]:
    """``{value: PR}`` of every probe of ``method`` under ``probe_key`` (the same method setting,
    calibration data, backbone, seed and code, so the same value gives the same PR) kept in ``folder``:
    in :func:`probes_path` and, with ``logs``, in the calibration logs (to any target) there and in
    ``keyed/``."""
    known: dict[float, float] = {}
    pattern = f"{path_component(method, 'method.name')}_pr*.json"  # in keyed/, the probes file matches it too
    paths = {*folder.glob(pattern), *(folder / KEYED_DIR).glob(pattern)} if logs else set()
    for path in sorted(paths | {probes_path(folder, method, probe_key)}):
        logged = read_log(path)
        if isinstance(logged, dict) and logged.get("method") == method and logged.get("probe_key") == probe_key:
            try:
                known.update(_valid_probes(logged.get("probes", [])))
            except ValueError as err:  # a cache: a damaged file is measured again, not trusted or fatal
                print(f"calibrate: ignoring the probes in {path}: {err}", file=sys.stderr, flush=True)
    return known


def _valid_probes(probes: Any) -> dict[float, float]:
    """``{value: PR}`` of a logged ``probes`` list of ``[value, PR]`` pairs (finite value, PR in [0, 1]);
    ``ValueError`` naming the first bad entry otherwise."""
    if not isinstance(probes, list):
        raise ValueError(f"'probes' is {type(probes).__name__}, not a list of [value, PR] pairs")
    valid: dict[float, float] = {}
    for i, entry in enumerate(probes):
        if not (isinstance(entry, list) and len(entry) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in entry)):
            raise ValueError(f"probe {i} is {json.dumps(entry)[:80]}, not a [value, PR] pair of numbers")
        value, pr = map(float, entry)
        if not (math.isfinite(value) and 0.0 <= pr <= 1.0):
            raise ValueError(f"probe {i} is {entry}: the value must be finite and the PR within [0, 1]")
        valid[value] = pr
    return valid


CALIBRATION_LEGACY = Legacy(required=(("*_pr*.json",), ("*_bytes*.json",)),
                            names=("method", KEYED_DIR, "*_pr*.json", "*_bytes*.json"))
"""A calibration folder written before markers existed: its logs, ``method/`` and ``keyed/``."""


def claim_calibration(out_dir: str | Path, log_name: str) -> OutputFolder:
    """Claim ``<out_dir>/calibration`` for a calibration whose log is named ``log_name``, before any work
    (:mod:`cmbench.runs.output_folder`: an empty folder or one CMBench made), and list what it writes there.

    Raises
    ------
    OutputFolderError
        One line: the folder is a file or a link, someone else's, another kind's, its log of that name is
        not CMBench's, or its ``method/`` or ``keyed/`` is a link or a file (written through, it would
        write outside the folder).
    """
    base = Path(out_dir) / CALIBRATION_DIR
    folder = claim(base, "calibration", "out_dir's calibration folder", names=("method", KEYED_DIR, log_name),
                   legacy=CALIBRATION_LEGACY)
    for sub in ("method", KEYED_DIR):
        inside = base / sub
        if inside.is_symlink() or (inside.exists() and not inside.is_dir()):
            raise OutputFolderError(f"{folder.where}: its {sub} is {'a link' if inside.is_symlink() else 'not a folder'}"
                                    f" (a calibration is never written through one): remove it, or choose another out_dir")
    folder.add("method", KEYED_DIR, log_name)
    return folder


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole, through a new hidden file renamed into place (never through a link,
    symbolic or hard: :func:`cmbench.runs.atomic.write_text`); its folder is created when missing.

    Raises
    ------
    cmbench.runs.atomic.OutputError
        The folder cannot be written (one line naming the file).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise atomic.OutputError(f"cannot write {path}: {err.strerror or err}") from err
    atomic.write_text(path, text)


def _held_text(path: Path) -> str | None:
    """What a file CMBench writes holds now (bounded), or None when absent or not a readable regular file:
    it is then written."""
    try:
        return bounded_read.read_optional_text(path, "calibration log")
    except (OSError, ValueError, bounded_read.ReadLimitError):
        return None


def calibration_probe_key(setting: dict[str, Any]) -> str:
    """The key of what a calibration's probes measured (method without its knob, knob, calibration data
    and tasks, backbone, generation, seed, code identity), with paths inside the installed package
    written relative to it (:func:`cmbench.identity.code.portable`), as run identities are: another
    checkout or a moved install reuses the calibrations, as it reuses the runs."""
    return config_hash(portable(setting))


def read_log(path: Path) -> Any:
    """A calibration log's JSON (bounded: :data:`cmbench.bounded_read.LIMITS`), or None when absent or not
    JSON.

    Raises
    ------
    ReadLimitError
        Not a regular file, or over the limit of a calibration log.
    """
    try:
        text = bounded_read.read_optional_text(path, "calibration log")
        return None if text is None else json.loads(text)
    except (OSError, ValueError, RecursionError):
        return None


def _fraction(value: Any, closed: bool = True) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return number and 0.0 <= value <= 1.0 and (closed or value < 1.0)


def log_problem(logged: "Calibration", knob: Knob) -> str | None:
    """What makes a received calibration log impossible for ``knob`` (``"value: is 1e+308, expected ..."``),
    or None: its knob value inside the knob's range, its PRs fractions, its probes ``[value, PR]`` pairs."""
    value = logged.value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not (
            knob.low <= value <= knob.high) or (knob.integer and value != int(value)):
        kind = "a whole number" if knob.integer else "a number"
        return f"value: is {json.dumps(value)[:60]}, expected {kind} in the knob's range [{knob.low:g}, {knob.high:g}]"
    if logged.knob != knob.name:
        return f"knob: is {json.dumps(logged.knob)[:60]}, expected {knob.name!r}"
    for name, closed in (("calibration_pr", True), ("target_pr", False), ("tolerance", False)):
        if not _fraction(getattr(logged, name), closed):
            return f"{name}: is {json.dumps(getattr(logged, name))[:60]}, expected a fraction in [0, 1{']' if closed else ')'}"
    if not isinstance(logged.within_tolerance, bool):
        return f"within_tolerance: is {json.dumps(logged.within_tolerance)[:60]}, expected true or false"
    for name in ("label", "method", "note"):
        if not isinstance(getattr(logged, name), str):
            return f"{name}: is {json.dumps(getattr(logged, name))[:60]}, expected a string"
    for name in ("probes", "reused_probes"):
        try:
            _valid_probes(getattr(logged, name))
        except ValueError as err:
            return f"{name}: {err}"
    if logged.quantity not in NAMED:
        return f"quantity: is {json.dumps(logged.quantity)[:60]}, expected one of {', '.join(NAMED)}"
    return _probe_problem(logged, knob, NAMED[logged.quantity])


def _probe_problem(logged: "Calibration", knob: Knob, quantity: TargetQuantity) -> str | None:
    """What makes a log's value disagree with its own probes, or None: the value must be one the log
    measured (``probes`` or ``reused_probes``), the one nearest the target (as the search chooses), with the
    ``calibration_pr`` and ``within_tolerance`` that probe gives. A value forged inside the knob's range
    (Streaming's window set to 0) is caught here, unless its probes are forged with it."""
    measured = {**_valid_probes(logged.reused_probes), **_valid_probes(logged.probes)}
    value = float(logged.value)
    count = f"{len(measured)} probe{'' if len(measured) == 1 else 's'}"
    if value not in measured:
        return f"value: {knob.name}={logged.value} is none of the log's {count} (a calibrated value is one it measured)"
    pr, aim = measured[value], quantity.searched(logged.target_pr)
    nearest, best = min(((v, p) for v, p in measured.items() if knob.low <= v <= knob.high),
                        key=lambda entry: (abs(entry[1] - aim), entry[0]))
    if abs(pr - aim) > abs(best - aim):
        return (f"value: {knob.name}={logged.value} measured {quantity.text(pr)}, but the log's probe "
                f"{knob.name}={nearest:g} measured {quantity.text(best)}, nearer the target {quantity.text(aim)}")
    if abs(quantity.shown(pr) - logged.calibration_pr) > 1e-12:
        return (f"calibration_pr: is {json.dumps(logged.calibration_pr)}, but the log's probe {knob.name}={logged.value} "
                f"measured {quantity.text(pr)}")
    within = abs(pr - aim) <= logged.tolerance
    if logged.within_tolerance != within:
        return (f"within_tolerance: is {json.dumps(logged.within_tolerance)}, but {quantity.text(pr)} is "
                f"{'within' if within else 'not within'} {logged.tolerance:g} of the target {quantity.text(aim)}")
    return None


def _cached(log_path: Path, key: str, knob: Knob, own: dict[str, str], say: bool = True) -> "Calibration | None":
    """The calibration logged at ``log_path`` when its key is ``key`` and its values are possible for
    ``knob`` (:func:`log_problem`; an impossible one is calibrated again, saying why when ``say``), else None.

    ``own`` holds the fields CMBench computes for this calibration (``method``, ``label``, ``yaml``, ``log``):
    they replace the log's, which are data (a received log's ``yaml`` never names the config folder of a run)."""
    logged = read_log(log_path)
    try:
        earlier = Calibration(**{**logged, **own}) if isinstance(logged, dict) else None
    except TypeError:
        return None
    if earlier is None or earlier.key != key:
        return None
    problem = log_problem(earlier, knob)
    if problem is not None:
        if say:
            print(f"calibrate: calibration log {log_path}: {problem}: not reused, calibrating again", file=sys.stderr,
                  flush=True)
        return None
    earlier.cached = True
    return earlier


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"<prefix>.a.b": 1}`` (lists are values)."""
    if not isinstance(value, dict):
        return {prefix: value}
    return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}.{key}").items()}


def stored_format(cfg: DictConfig) -> dict[str, Any]:
    """``{"storage": <format's fields>}`` when ``cfg``'s run stores its history quantized and ``{"cache": {"dtype":
    ...}}`` when it sets the cache's precision (``cache.dtype``), else ``{}``: a part of what decides a
    calibration's probes (PR and bytes are measured in the format and precision), absent in full precision at
    the model's own, as in a run's hash, so that such calibrations keep their keys."""
    storage = calibration_storage(cfg)
    dtype = calibration_cache_dtype(cfg)
    return {**({"storage": storage.knobs(file_fingerprint)} if storage.quantized else {}),
            **({"cache": {"dtype": dtype}} if dtype is not None else {})}


def format_floor(meter: PRMeter, quantity: TargetQuantity, cfg: DictConfig, target: float, tolerance: float) -> float:
    """The searched quantity with nothing pruned: for a bytes target in a quantized storage format, the share
    of FullKV's bytes that FullKV in that format saves on the calibration tasks (measured, one run of them);
    otherwise 0.

    Raises
    ------
    ConfigError
        A bytes target above what FullKV stores in the format (no pruning reaches it), in one line.
    """
    storage = calibration_storage(cfg)
    if quantity is not BYTES or not storage.quantized:
        return 0.0
    fmt = f"storage={storage.name} storage.bits={storage.bits}"
    print(f"calibrate: first FullKV in {fmt} on the calibration tasks (what the format stores keeping every token)",
          file=sys.stderr, flush=True)
    floor = meter(build_method({"name": "fullkv"}))
    kept = quantity.shown(floor)
    print(f"calibrate: FullKV in {fmt} stores {kept:.4f} of full precision's KV bytes (no knob stores more; a "
          "threshold method's guess aims from it)", file=sys.stderr, flush=True)
    if quantity.searched(target) < floor - tolerance:
        raise ConfigError(f"{quantity.key}={target:g}: above the {kept:.4f} of FullKV's KV bytes that {fmt} stores "
                          "keeping every token (measured on the calibration tasks); "
                          f"pruning only lowers it: give a target at most {kept:.4f}, or a format with more bits")
    return floor


def calibration_setting(cfg: DictConfig, method_setting: dict[str, Any], root: str, n_tasks: int, tolerance: float,
                        max_probes: int) -> dict[str, Any]:
    """What decides a calibration besides its code and target, flat by the keys a user sets
    (:attr:`Calibration.setting`): the method without its knob, the data (the calibration folder
    ``root`` among them), backbone, generation, seeds, the calibration options and a quantized storage format."""
    values = {"calibration": {"tasks": n_tasks, "tolerance": tolerance, "max_probes": max_probes, "root": root},
              "sample_seed": OmegaConf.select(cfg, "sample_seed"), "seed": int(cfg.seed), "method": method_setting,
              "data": to_dict(cfg.data), "backbone": to_dict(cfg.backbone), "generation": to_dict(cfg.generation),
              **stored_format(cfg)}
    return {k: v for key, value in portable(values).items() for k, v in _flat(value, key).items()}


def _shown(value: Any) -> str:
    text = "unset" if value is None else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def not_reused(log_path: Path, key: str, setting: dict[str, Any], code: dict[str, Any], task_ids: list[str]) -> str | None:
    """Why the calibration logged at ``log_path`` (the last one to this target in its folder) is not this one,
    of ``key`` (``setting``: :func:`calibration_setting`; ``code``: the code identity's parts; ``task_ids``):
    the settings that differ with both values, up to three, else other code, else other tasks. None when
    there is no such log or it is this calibration's (redone because its own files are gone or damaged).

    A log written before settings were logged gives its task count, calibration folder and tolerance.
    """
    try:
        earlier = read_log(log_path)
        before = {"calibration.tasks": len(earlier["data"]["task_ids"]), "calibration.root": earlier["data"]["root"],
                  "calibration.tolerance": earlier["tolerance"], **earlier.get("setting", {})}
        earlier_code, earlier_tasks = dict(earlier["code"]), earlier["data"]["task_ids"]
    except (OSError, ValueError, TypeError, KeyError):  # no log, or not one: nothing to compare with
        return None
    if earlier.get("key") == key:
        return None
    keys = set(before) | set(setting) if "setting" in earlier else set(before)
    changed = sorted(k for k in keys if before.get(k) != setting.get(k))
    parts = sorted(p for p in set(code) | set(earlier_code) if code.get(p) != earlier_code.get(p))
    head = f"calibration log {log_path} was made"
    if changed:
        was, now = (some([f"{k}={_shown(values.get(k))}" for k in changed]) for values in (before, setting))
        return f"{head} with {was}, this one with {now}"
    if parts:
        return f"{head} by other code (its {', '.join(parts)} part{'s' if len(parts) > 1 else ''})"
    if earlier_tasks != task_ids:
        return f"{head} on other calibration tasks (the calibration data changed)"
    why = "what differs is not logged" if "setting" in earlier else "its log predates the settings it records"
    return f"{head} with other settings than this one ({why})"


def calibrate_method(cfg: DictConfig, target_pr: float, tolerance: float = 0.005, n_tasks: int = 4,
                     max_probes: int = 14, on_probe: Callable[[float, float], None] | None = None,
                     on_task: Callable[[int, int], None] | None = None, quantity: TargetQuantity = PR) -> Calibration:
    """Find ``cfg.method``'s knob value for ``target_pr`` on calibration tasks; write its yaml and log.

    Parameters
    ----------
    cfg : DictConfig
        The root config (``method``, ``data`` of the TEST suite, ``backbone``, ``generation``, ``seed``,
        ``out_dir``, ``calibration.root``).
    target_pr : float
        In [0, 1).
    tolerance : float
        Stop once a probe's PR is this close to the target (0.005: half a point).
    n_tasks : int
        Calibration tasks (a stratified seeded sample, as ``limit=n_tasks``).
    max_probes : int
        Most settings measured.
    on_probe : callable ``(value, pr)``, optional
        Called after every probe (the command prints the search log with it).
    on_task : callable ``(done, total)``, optional
        Called after every calibration task of a probe (progress inside a probe).
    quantity : TargetQuantity
        What ``target_pr`` is: a PR (default), or :data:`~cmbench.calibration.target_quantity.BYTES`, the
        device bytes of the KV cache over FullKV's in (0, 1]; the same search aims at the share saved.

    Returns
    -------
    Calibration

    Raises
    ------
    ConfigError
        No knob, quota mode, a target the knob's range cannot reach, bad calibration data.
    """
    target_pr = quantity.check(target_pr, quantity.key)
    if quantity is BYTES:
        check_bytes_floor(cfg, target_pr, quantity.key)
    searched = quantity.searched(target_pr)
    if not 0.0 < tolerance < 1.0:
        raise ConfigError(f"calibration.tolerance={tolerance}: expected a PR difference in (0, 1)")
    method_cfg = to_dict(cfg.method)
    knob = method_knob(method_cfg)
    setting = {k: v for k, v in canonical_method_config(method_cfg).items() if k != knob.name}  # refuses bad knobs
    check_format_for_method(config_class(method_cfg), calibration_storage(cfg))  # before any folder is made
    name = str(cfg.method.name)
    # the files are named after the method in its storage format: a format's calibration is its own
    yaml_path, log_path = calibration_paths(str(cfg.out_dir), name + storage_suffix(cfg.get("storage")), target_pr,
                                            quantity)
    claim_calibration(str(cfg.out_dir), log_path.name)  # someone else's folder is refused before any work
    cal_cfg = calibration_config(cfg)
    tasks = calibration_tasks(cal_cfg, n_tasks)
    manifest = Path(str(cal_cfg.data.root)) / str(cal_cfg.data.manifest)
    code = code_identity(resolve_method_class(method_cfg), to_dict(cfg.backbone), manifest)
    data = {"root": str(cal_cfg.data.root), "world_seed": OmegaConf.select(cal_cfg, "data.world_seed"),
            "task_ids": [t.task_id for t in tasks]}
    probe_key = calibration_probe_key({"method": setting, "knob": asdict(knob),
                                       "data": {**to_dict(cal_cfg.data), "task_ids": data["task_ids"]},
                                       "backbone": to_dict(cfg.backbone), "generation": to_dict(cfg.generation),
                                       "seed": int(cfg.seed), "code": code.hash, **stored_format(cfg),
                                       **({} if quantity is PR else {"quantity": quantity.name})})
    key = config_hash({"probe_key": probe_key, "target_pr": target_pr, "tolerance": tolerance, "max_probes": max_probes})
    logged = calibration_setting(cfg, setting, data["root"], n_tasks, tolerance, max_probes)
    keyed = keyed_log_path(log_path, key)
    unresolved = OmegaConf.to_container(cfg.method, resolve=False)
    assert isinstance(unresolved, dict)

    own = {"method": name, "label": f"{name}@{pr_tag(target_pr, quantity)}", "yaml": str(yaml_path), "log": str(log_path)}

    def publish(result: Calibration) -> None:
        """Write ``result`` as the calibration last found or reused: its yaml (exactly what CMBench writes for
        it: a received yaml saying anything else is replaced), the log named after the target and the log under
        its key, each unless it already holds exactly that; ``result.written`` lists the files written."""
        yaml_text = (f"# {name} calibrated to {quantity.label} {target_pr:g} on {data['root']} (log: {log_path.name})\n"
                     + OmegaConf.to_yaml(OmegaConf.create({**unresolved, knob.name: result.value})))
        result.written = []
        for path, text in ((yaml_path, yaml_text), (log_path, result.to_json()), (keyed, result.to_json())):
            if _held_text(path) != text:
                _write(path, text)
                result.written.append(str(path))

    # one process calibrates a setting to a target at a time: another one (a rank of a split model, a
    # second sweep lane) waits for it, then reuses its result instead of measuring the same probes again;
    # the log under its key keeps it beside the other settings' calibrations to that target
    with RunLock(keyed, on_wait=lambda who: print(
            f"calibrate: waiting for {who}, which is calibrating {name} to PR {target_pr:g} ({log_path})",
            file=sys.stderr, flush=True)):
        earlier = _cached(keyed, key, knob, own)
        if earlier is None and yaml_path.is_file():  # a folder written before logs were kept under their keys
            earlier = _cached(log_path, key, knob, own)
        if earlier is not None:
            publish(earlier)
            return earlier
        why = not_reused(log_path, key, logged, code.parts, data["task_ids"])
        if why is not None:
            print(f"calibrate: {why}: calibrating again (another setting gives another {knob.name})",
                  file=sys.stderr, flush=True)

        meter = PRMeter(cal_cfg, tasks, on_task, quantity)

        def build(value: float) -> Method:
            return build_method({**method_cfg, knob.name: knob_value(knob, value)})

        configured = build_method(method_cfg)
        floor = format_floor(meter, quantity, cfg, target_pr, tolerance)
        aim = ScoreGuess(build, knob, searched, floor) if records_scores(configured) else None

        def probe(value: float) -> float:
            method = build(value)
            recorded = aim.recording(method, value) if aim is not None else None
            pr = meter(method)
            keep_probe(log_path.parent, name, probe_key, value, pr)
            if recorded is not None:
                recorded(pr)
            if on_probe is not None:
                on_probe(value, pr)
            return pr

        known = shared_probes(log_path.parent, name, probe_key)
        start = float(getattr(configured, knob.name))  # the configured value: the first probe
        try:
            found = search_knob(knob, searched, probe, tolerance=tolerance, max_evaluations=max_probes, known=known,
                                start=start, guess=aim, quantity=quantity)
        except KeyboardInterrupt:  # Ctrl-C: every finished probe is in the probe cache; a rerun starts from them
            kept = len(shared_probes(log_path.parent, name, probe_key, logs=False))
            raise KeyboardInterrupt(f"interrupted; {kept} finished probe{'' if kept == 1 else 's'} kept in "
                                    f"{probes_path(log_path.parent, name, probe_key)} (a rerun starts from them)") from None
        value = knob_value(knob, found.value)
        result = Calibration(method=own["method"], label=own["label"], knob=knob.name, value=value,
                             calibration_pr=quantity.shown(found.pr), target_pr=target_pr, tolerance=tolerance,
                             within_tolerance=abs(found.error) <= tolerance,
                             note=_note(knob, found.value, found.pr, searched, tolerance, [*known.items(), *found.log], quantity),
                             probes=[[knob_value(knob, v), p] for v, p in found.log], data=data, code=code.parts, key=key,
                             yaml=own["yaml"], log=own["log"], probe_key=probe_key,
                             reused_probes=[[knob_value(knob, v), p] for v, p in sorted(known.items())],
                             setting=logged, quantity=quantity.name)
        publish(result)
        return result
