"""The run spec: a run's configuration resolved and checked once, at the entrance, into typed pieces.

``python -m cmbench run`` (:mod:`cmbench.cli.run`) and ``cmbench.evaluate`` (:mod:`cmbench.api`) compose
the Hydra config, then call :func:`resolve_run` once. It turns the config into plain values (the only
``OmegaConf`` -> ``dict`` conversion of a run), checks every knob of every group (types, ranges, finite
numbers: one line naming the key and what is expected, before any data or model is loaded), builds the
method once, and computes the run's identity (label, config hash, setup hash) and output paths.

Everything below the entrance receives the typed pieces it needs (:class:`DataSpec`,
:class:`GenerationSpec`, the :class:`~cmbench.methods.base.Method` instance, the backbone and scorer
configs as plain mappings, :class:`Selection`, :class:`Outputs`, :class:`RunIdentity`), never the
whole config::

    cfg = compose(...)                       # Hydra: configs/ + CMBENCH_CONFIG_PATH + overrides
    spec = resolve_run(cfg)                  # checked, frozen
    run_experiment(spec)                     # cmbench.runs.experiment -> runner -> evaluator -> records
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from cmbench.backbones.loading import backbone_loader
from cmbench.cache.quantized import StorageFormat, storage_format
from cmbench.config_paths import to_dict
from cmbench.config_schema import (
    BACKBONE_KEYS,
    CACHE_DTYPES,
    REFERENCE_AGGREGATIONS,
    ROOT_KEYS,
    SCORE_SOURCES,
    SCORER_KEYS,
    keys_with_role,
)
from cmbench.data.subsets import load_subset
from cmbench.errors import ConfigError
from cmbench.generation import GenerationSettings, check_settings
from cmbench.generation.sampler import FlowMatchSampler
from cmbench.hashing import config_hash
from cmbench.methods.base import Method
from cmbench.methods.registry import build_method, canonical_method_config, full_method_config
from cmbench.identity.code import CodeIdentity, code_identity, file_fingerprint, portable
from cmbench.identity.labels import check_label, run_label
from cmbench.identity.paths import path_component

# keys that choose which tasks run or how they are displayed, not what a task's record contains
SELECTION_KEYS = keys_with_role(ROOT_KEYS, "selection")


def check_shard(count: int, index: int) -> None:
    """Raise a :class:`ConfigError` unless ``count >= 1`` and ``0 <= index < count``."""
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"shard.index must be in [0, shard.count), got index={index} count={count}")


def slurm_array() -> tuple[int, int] | None:
    """This task of a Slurm array as a shard, ``(SLURM_ARRAY_TASK_COUNT, its place in the array)``, the
    place counted from ``SLURM_ARRAY_TASK_MIN`` in steps of ``SLURM_ARRAY_TASK_STEP`` (``--array=1-8``
    and ``--array=0-14:2`` are eight shards each); None outside an array.

    Raises
    ------
    ConfigError
        The variables are not whole numbers, or the task's id is not on the array's range (an array of
        listed ids, ``--array=1,3,8``, has no place for each task: give ``shard.index`` yourself).
    """
    if "SLURM_ARRAY_TASK_ID" not in os.environ:
        return None
    names = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP")
    try:
        task, count, first, step = (int(os.environ.get(name, default)) for name, default in zip(names, "0101"))
    except ValueError as err:
        raise ConfigError(f"Slurm array variables ({', '.join(names)}): expected whole numbers ({err})") from err
    place, off_step = divmod(task - first, step) if step > 0 else (-1, 0)
    if off_step or not 0 <= place < count:
        raise ConfigError(f"Slurm array task {task} is not on the array's range ({count} tasks from {first} in steps "
                          f"of {step}): submit a range (--array=0-{count - 1}) or set shard.count and shard.index")
    return count, place


def shard_from_env(count: int, index: int, sequence: int = 1, array: bool = True) -> tuple[int, int]:
    """The shards of the launcher that started the run, when no shard was configured: torchrun's groups
    of ``sequence`` ranks (``WORLD_SIZE / sequence``, ``RANK // sequence``) and, with ``array``, the tasks
    of a Slurm array (:func:`slurm_array`), each array task's groups its share's shards.

    Raises
    ------
    ConfigError
        A ``WORLD_SIZE`` ``sequence`` does not divide, a Slurm array task off its array's range, or a
        configured shard as well as several groups or array tasks (a split run without torchrun is
        refused where it launches: :func:`cmbench.runs.ranks.launch_of`; ``plan`` sizes one rank of a
        split run from a plain process).
    """
    groups, group = 1, 0
    if "WORLD_SIZE" in os.environ:
        world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", "0"))
        if world % sequence:
            raise ConfigError(f"parallel.sequence={sequence} does not divide torchrun's {world} processes "
                              f"(WORLD_SIZE): each model needs a whole group of {sequence} ranks")
        groups, group = world // sequence, rank // sequence
    tasks, task = (slurm_array() if array else None) or (1, 0)
    if groups * tasks == 1:
        return count, index
    if count == 1:
        return tasks * groups, task * groups + group
    launchers = [f"torchrun's {groups} groups of parallel.sequence={sequence} ranks"] * (groups > 1) \
        + [f"the Slurm array's {tasks} tasks (SLURM_ARRAY_TASK_COUNT)"] * (tasks > 1)
    raise ConfigError(f"shard.count={count} and {' and '.join(launchers)} both shard the tasks: set one of them"
                      + ("; an array that runs other settings, not shards, sets shard.slurm_array=false" if tasks > 1
                         else ""))



@dataclass(frozen=True)
class DataSpec:
    """The dataset of a run.

    Attributes
    ----------
    name : str
    root : Path
        Where the dataset is (``data.root``, read here and nowhere else in a run).
    manifest : str
        The manifest file, relative to ``root``.
    fps : float
        Frame rate of saved continuations (> 0).
    config : dict
        The whole ``data`` group (adapter and build knobs), for :func:`cmbench.data.adapter.build_adapter`.
    """

    name: str
    root: Path
    manifest: str
    fps: float
    config: dict[str, Any]

    @property
    def manifest_path(self) -> Path:
        return self.root / self.manifest


@dataclass(frozen=True)
class GenerationSpec:
    """The AR loop's settings shared by every method, and the continuation length.

    Attributes
    ----------
    settings : GenerationSettings
    continuation_frames : int
        Latent frames generated per task (>= 1).
    """

    settings: GenerationSettings
    continuation_frames: int


@dataclass(frozen=True)
class Selection:
    """Which tasks run, with which seeds, in which shard.

    Attributes
    ----------
    seed : int
        Global seed (>= 0); a task's seed derives from it and its id.
    limit : int or None
        A stratified sample of this many tasks (> 0), or all.
    sample_seed : int
        The seed of that sample (>= 0), not the run's: every ``seed`` of a sweep runs the same tasks.
    task_ids : tuple of str or None
        Exactly these tasks (``task_ids``, or the ids of the named ``subset``), or every task.
    shard : (count, index)
    keep_other_code : bool
        Keep task records computed by other code instead of computing them again.
    """

    seed: int
    limit: int | None
    sample_seed: int
    task_ids: tuple[str, ...] | None
    shard: tuple[int, int]
    keep_other_code: bool = False


@dataclass(frozen=True)
class ParallelSpec:
    """One model over several torchrun ranks (``parallel``; :mod:`cmbench.runs.ranks`).

    Attributes
    ----------
    sequence : int
        Ranks per model (Ulysses sequence parallelism; 1: one process per model).
    check_masks : bool
        Debug: compare a checksum of every keep mask across the ranks of a model.
    """

    sequence: int = 1
    check_masks: bool = False


@dataclass(frozen=True)
class Outputs:
    """Where a run writes and how it shows progress.

    Attributes
    ----------
    out_dir : Path
    run_dir : Path
        ``<out_dir>/<data>/<method>__<backbone>__<scorer>__<config hash>``.
    save_videos : bool
    lossless_max_pixels : int
        Also write a lossless video when a frame has at most this many pixels (0: never).
    progress : bool
        A progress bar; False: a line every ``progress_every`` tasks or ``progress_seconds`` seconds.
    progress_every : int
    progress_seconds : float
    threads : int or None
        torch CPU threads, or torch's default.
    tracker : object
        The ``logging`` config as given (the experiment tracker; checked when the run starts,
        :func:`cmbench.runs.tracking.tracker_settings`); None: no tracker.
    """

    out_dir: Path
    run_dir: Path
    save_videos: bool
    lossless_max_pixels: int
    progress: bool
    progress_every: int
    progress_seconds: float
    threads: int | None
    tracker: Any = None


@dataclass(frozen=True)
class RunIdentity:
    """What names a run (docs/runs.md).

    Attributes
    ----------
    label : str
        The leaderboard name (display only).
    config_hash : str
        Hash of :attr:`result_config` (paths inside CMBench written relative to the package).
    setup_hash : str
        The same without the global ``seed``: equal for the seeds of one setup.
    result_config : dict
        The resolved config minus selection, display and runtime keys (the run's ``config.yaml``).
    """

    label: str
    config_hash: str
    setup_hash: str
    result_config: dict[str, Any]


@dataclass(frozen=True)
class RunSpec:
    """A run, resolved and checked (see the module docstring).

    Attributes
    ----------
    data : DataSpec
    backbone : dict
        The resolved backbone config (its loader's ``_target_``, arguments, ``context``, ``memory``).
    method : Method
        The method, built once from :attr:`method_config`.
    method_name : str
        The method's config name (``method=<name>``, or the class's name for a class given by
        ``_target_``): it names the run directory and the records' ``method``.
    method_config : dict
        The method's complete config: ``name`` (and ``_target_``) and every knob.
    scorer : dict
        The resolved scorer config.
    generation : GenerationSpec
    selection : Selection
    outputs : Outputs
    identity : RunIdentity
    parallel : ParallelSpec
        Ranks per model (torchrun) and the cross-rank mask check.
    score_source : {"frames", "mp4"}
        What is scored: the decoded frames, or their saved mp4 decoded again (as the authors score).
    target_fields : dict
        ``target_pr`` and ``calibration_pr`` for every record: the calibrated target of
        ``method.target_pr`` (resolved at the entrance by
        :func:`cmbench.calibration.target_pr.resolve_target_pr`), or a quota's ``quota_pr``.
    """

    data: DataSpec
    backbone: dict[str, Any]
    method: Method
    method_name: str
    method_config: dict[str, Any]
    scorer: dict[str, Any]
    generation: GenerationSpec
    selection: Selection
    outputs: Outputs
    identity: RunIdentity
    parallel: ParallelSpec = ParallelSpec()
    score_source: str = "frames"
    target_fields: dict[str, Any] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.outputs.run_dir

    def plan_inputs(self) -> dict[str, Any]:
        """What the memory planner reads of this run (:func:`plan_inputs`)."""
        return plan_inputs(self.backbone, self.data, self.scorer, self.generation, self.parallel.sequence)

    def code_identity(self, scorer_hash: str | None) -> CodeIdentity:
        """The code identity of this run (:func:`cmbench.identity.code.code_identity`); call once the data
        is present (the manifest is part of it)."""
        return code_identity(type(self.method), self.backbone, self.data.manifest_path, scorer_hash)


def plan_inputs(backbone: Mapping[str, Any], data: DataSpec, scorer: Mapping[str, Any], generation: GenerationSpec,
                sequence: int = 1) -> dict[str, Any]:
    """The plain config the memory planner reads (:mod:`cmbench.backbones.memory.run_plan`): the backbone,
    data and scorer configs, the continuation length, the ranks per model and the KV storage format."""
    return {"backbone": backbone, "data": data.config, "scorer": scorer,
            "generation": {"continuation_frames": generation.continuation_frames},
            "parallel": {"sequence": sequence}, "storage": asdict(generation.settings.storage)}


@dataclass(frozen=True)
class ScoreSpec:
    """What ``score`` scores, resolved and checked (:func:`resolve_scoring`).

    Attributes
    ----------
    data : DataSpec
        The tasks the videos are matched to.
    scorer : dict
        The resolved scorer config.
    videos : Path
        The folder of ``<task_id>.mkv`` / ``.mp4`` continuations.
    out : Path or None
        The output folder (None: ``<videos>/scores_<scorer name>``).
    label : str or None
        The records' label (None: from the videos folder).
    """

    data: DataSpec
    scorer: dict[str, Any]
    videos: Path
    out: Path | None
    label: str | None


# ---------------------------------------------------------------------------------------------- checks
MAX_SEED = 2**63 - 1
"""The largest ``seed`` / ``sample_seed``: records hold seeds as signed 64-bit integers."""
MAX_THREADS = 1024
"""The most torch CPU threads ``threads=`` may ask for (more only hangs while the pool is made)."""
MAX_CONTINUATION_FRAMES = 4096
"""The most latent frames ``generation.continuation_frames`` may ask for (LingBot's continuations are tens)."""
GENERATION_KEYS = ("timesteps", "lingbot_timesteps", "stochastic", "continuation_frames", "rope_reindex",
                   "reindex_recent", "reindex_virtual_length")
"""Every key of the ``generation`` block (configs/config.yaml); any other is refused, since the block is hashed."""


def check_known_keys(plain: Mapping[str, Any]) -> None:
    """Refuse root keys and ``generation`` keys nothing reads (``+foo=1``, ``+generation.bogus=2``): they
    would change nothing but the run's hash, or nothing at all.

    Raises
    ------
    ConfigError
        One line naming every unknown key.
    """
    unknown = [str(k) for k in plain if k not in ROOT_KEYS and k != "hydra"]
    generation = plain.get("generation")
    if isinstance(generation, Mapping):
        unknown += [f"generation.{k}" for k in generation if k not in GENERATION_KEYS]
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(sorted(unknown))}: nothing reads them (a `+key=value` "
                          f"adds a key; `python -m cmbench run --help` lists the settings)")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_finite(value: Any, key: str) -> None:
    """Refuse NaN and infinity anywhere in a config value (nested mappings and lists too).

    Raises
    ------
    ConfigError
        ``<key>=nan: expected a finite number``.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value!r}: expected a finite number")
    if isinstance(value, Mapping):
        for k, v in value.items():
            check_finite(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite(v, f"{key}[{i}]")


def whole(value: Any, key: str, minimum: int, optional: bool = False, what: str | None = None,
          maximum: int | None = None) -> int | None:
    """``value`` as a whole number >= ``minimum`` and <= ``maximum`` (when given; ``None`` allowed when
    ``optional``), or a one-line error ``<key>=<value>: expected <what>`` (``at most <maximum>`` added)."""
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{key}={value!r}: expected "
                          f"{what or f'a whole number >= {minimum}' + (' (or null)' if optional else '')}"
                          + ("" if maximum is None else f", at most {maximum}"))
    if maximum is not None and value > maximum:
        raise ConfigError(f"{key}={value!r}: expected at most {maximum}")
    return value


def positive(value: Any, key: str, minimum: float = 0.0, strict: bool = True, what: str | None = None) -> float:
    """``value`` as a finite number > ``minimum`` (>= with ``strict=False``), or a one-line error."""
    ok = _number(value) and math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        bound = (">" if strict else ">=") + f" {minimum:g}"
        raise ConfigError(f"{key}={value!r}: expected {what or 'a finite number ' + bound}")
    return float(value)


def thread_count(value: Any) -> int | None:
    """``threads``: a whole number in [1, :data:`MAX_THREADS`], or None (torch's default)."""
    return whole(value, "threads", 1, optional=True, maximum=MAX_THREADS,
                 what="a whole number of torch threads >= 1 (or null)")


def flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: expected true or false")
    return value


def _name(group: Mapping[str, Any], key: str) -> str:
    name = group.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key}: the config has no name (add `name: <file name>` to its yaml)")
    return name


# ---------------------------------------------------------------------------------------------- pieces
def generation_settings(generation: Mapping[str, Any]) -> GenerationSettings:
    """The loop's shared knobs from a ``generation`` block, checked.

    Raises
    ------
    ConfigError
        A timestep outside (0, 1000], a negative ``reindex_recent``, a ``reindex_virtual_length`` that
        is not a finite number > 0, a non-boolean flag.
    """
    if isinstance(generation, DictConfig):
        generation = to_dict(generation)
    check_finite(dict(generation), "generation")
    steps = generation.get("timesteps")
    if not isinstance(steps, (list, tuple)) or not steps or not all(
            _number(t) and math.isfinite(t) and 0 < t <= 1000 for t in steps):
        raise ConfigError(f"generation.timesteps={steps!r}: expected a list of numbers in (0, 1000]")
    return GenerationSettings(
        sampler=FlowMatchSampler(timesteps=tuple(steps),
                                 stochastic=flag(generation.get("stochastic"), "generation.stochastic")),
        reindex=flag(generation.get("rope_reindex"), "generation.rope_reindex"),
        reindex_recent=whole(generation.get("reindex_recent"), "generation.reindex_recent", 0) or 0,
        reindex_virtual_length=positive(generation.get("reindex_virtual_length"),
                                        "generation.reindex_virtual_length"),
    )


def _beside_weights(backbone: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``.json`` config beside the backbone's weights (``path``), or ``{}`` when there is none."""
    if not backbone.get("path"):
        return {}
    beside = Path(str(backbone["path"])).with_suffix(".json")
    try:
        meta = json.loads(beside.read_text()) if beside.is_file() else {}
    except (OSError, ValueError):
        meta = {}
    return meta if isinstance(meta, Mapping) else {}


def declared_chunk_tokens(backbone: Mapping[str, Any]) -> int | None:
    """Tokens of one chunk from the backbone's config alone: a planned backbone's geometry, or the tiny
    model's config beside its weights; ``None`` when neither says."""
    from cmbench.backbones.memory.run_plan import geometry_of, plans_memory

    if plans_memory(backbone):
        try:
            return geometry_of(backbone).tokens_per_chunk
        except (KeyError, TypeError, ValueError):
            return None
    meta = _beside_weights(backbone)
    dit = meta.get("dit")
    if "TinyWorldModel" in str(backbone.get("_target_", "")) and isinstance(dit, Mapping) \
            and _number(meta.get("chunk_frames")) and isinstance(dit.get("patch_size"), list):
        from cmbench.backbones.tiny import FRAME_SIZE

        _, ph, pw = (int(p) for p in dit["patch_size"])
        return int(meta["chunk_frames"]) * (FRAME_SIZE // 2 // ph) * (FRAME_SIZE // 2 // pw)
    return None


def declared_head_dim(backbone: Mapping[str, Any]) -> int | None:
    """The backbone's head dim from its config alone: its ``dit`` block, or the ``.json`` config beside
    its weights (``path``); ``None`` when neither says (the cache checks it when it is built)."""
    dit = backbone.get("dit")
    if not isinstance(dit, Mapping):
        dit = _beside_weights(backbone).get("dit")
    if isinstance(dit, Mapping) and _number(dit.get("dim")) and _number(dit.get("num_heads")) and dit["num_heads"]:
        return int(dit["dim"]) // int(dit["num_heads"])
    return None


def storage_spec(block: Any, backbone: Mapping[str, Any]) -> StorageFormat:
    """The ``storage`` group, checked against the backbone's head dim (``None``: full precision).

    Raises
    ------
    ConfigError
        One line naming the knob and its limit (a bit width not in {2, 4, 8}, a group size that does
        not divide the head dim, a negative recent window, more qvg clusters than a chunk's tokens).
    """
    if block is not None and not isinstance(block, Mapping):
        raise ConfigError(f"storage={block!r}: expected a storage group (storage=fp, kivi, qvg or chunkmean)")
    if block and block.get("name", "fp") == "fp":
        knobs = sorted(k for k, v in block.items() if k not in ("name", "description") and v is not None)
        if knobs:
            raise ConfigError(f"storage.{knobs[0]}={block[knobs[0]]!r}: full precision (storage=fp) has no knobs; "
                              f"a quantized format has: storage=kivi storage.{knobs[0]}=..., or qvg or chunkmean")
    fmt = storage_format(block).check(declared_head_dim(backbone), declared_chunk_tokens(backbone))
    return lowrank_basis(fmt, backbone) if fmt.name == "lowrank" else fmt


def lowrank_basis(fmt: StorageFormat, backbone: Mapping[str, Any]) -> StorageFormat:
    """A ``lowrank`` format with its key basis found (``storage.basis``, or the file beside the backbone's
    weights) and checked: there, fitted on these weights, holding ``rank`` directions.

    Raises
    ------
    ConfigError
        One line naming ``storage.basis`` or ``storage.rank`` and what is wrong.
    """
    from cmbench.cache.lowrank import basis_path, load_basis
    from cmbench.identity.code import path_fingerprint

    weights = backbone.get("path")
    if fmt.basis is None and not weights:
        raise ConfigError(f"storage.basis: not set, and backbone={backbone.get('name')} names no weights (path) to "
                          "find its key basis beside; give storage.basis=/path/to/key_basis.safetensors")
    path = Path(str(fmt.basis)) if fmt.basis is not None else basis_path(str(weights))
    if not path.is_file():
        raise ConfigError(f"storage.basis={path}: no key basis there; fit one on calibration contexts: "
                          f"python scripts/fit_key_basis.py backbone={backbone.get('name')}")
    try:
        basis, meta = load_basis(path)
    except Exception as err:  # a received file: any failure to read it is one line
        raise ConfigError(f"storage.basis={path}: not a key basis file ({type(err).__name__})") from None
    if weights and Path(str(weights)).exists() and meta.get("weights") != path_fingerprint(str(weights)):
        raise ConfigError(f"storage.basis={path}: fitted on other weights than backbone.path={weights} (fit it again)")
    if basis.ndim != 4:
        raise ConfigError(f"storage.basis={path}: not a key basis file (basis of shape {tuple(basis.shape)}, "
                          "expected [layers, heads, head dim, head dim])")
    if fmt.rank > basis.shape[-1]:  # type: ignore[operator]
        raise ConfigError(f"storage.rank={fmt.rank}: above the head dim {basis.shape[-1]} of the key basis "
                          f"(at most {basis.shape[-1]})")
    return replace(fmt, basis=str(path))


def check_format_for_method(method_class: type, storage: StorageFormat) -> None:
    """Refuse a merging method (its class's ``family``) in a quantized storage format, before anything is
    built or written: a merge is a count-weighted mean of values, which needs them in full precision.

    Raises
    ------
    ConfigError
        One line naming the method, the format and what runs instead.
    """
    if storage.quantized and getattr(method_class, "family", "") == "merging":
        name = getattr(method_class, "name", "") or method_class.__qualname__
        raise ConfigError(f"method {name} merges history rows (a count-weighted mean of values, which needs them in "
                          f"full precision): storage={storage.name} cannot hold them; run it with storage=fp, or "
                          f"storage={storage.name} with a method that does not merge (docs/kv_formats.md)")


def cache_dtype_spec(block: Any) -> str | None:
    """``cache.dtype``, checked: one of :data:`CACHE_DTYPES`, or ``None`` (the model's own precision; also for
    a config without a ``cache`` block).

    Raises
    ------
    ConfigError
        A ``cache`` that is not a block, or a ``dtype`` not in :data:`CACHE_DTYPES`.
    """
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise ConfigError(f"cache={block!r}: expected a block with dtype")
    dtype = block.get("dtype")
    if dtype is not None and dtype not in CACHE_DTYPES:
        raise ConfigError(f"cache.dtype={dtype!r}: expected one of {', '.join(CACHE_DTYPES)} or null (the model's own)")
    return dtype


def generation_spec(generation: Mapping[str, Any]) -> GenerationSpec:
    """:func:`generation_settings` and the continuation length."""
    frames = whole(generation.get("continuation_frames"), "generation.continuation_frames", 1,
                   maximum=MAX_CONTINUATION_FRAMES)
    return GenerationSpec(generation_settings(generation), int(frames or 1))


def data_spec(data: Mapping[str, Any]) -> DataSpec:
    """The ``data`` group, checked (name, root, manifest, frame rate and frame size)."""
    name = _name(data, "data")
    for key in ("root", "manifest"):
        if not isinstance(data.get(key), str) or not data.get(key):
            raise ConfigError(f"data.{key}={data.get(key)!r}: expected a path")
    root = Path(data["root"])
    if root.exists() and not root.is_dir():
        raise ConfigError(f"data.root={data['root']}: not a folder (a dataset is a folder of videos and a manifest)")
    if not root.resolve().name:
        raise ConfigError(f"data.root={data['root']}: the file system's root, not a dataset folder")
    for key in ("height", "width"):
        if key in data:
            whole(data[key], f"data.{key}", 1)
    return DataSpec(name=name, root=Path(data["root"]), manifest=str(data["manifest"]),
                    fps=positive(data.get("fps"), "data.fps"), config=dict(data))


def check_backbone(backbone: Mapping[str, Any]) -> None:
    """The keys of a backbone config CMBench reads: ``name``, ``_target_`` (what it makes, checked without
    calling it) and the ``context`` block."""
    name = _name(backbone, "backbone")
    backbone_loader(backbone)
    context = backbone.get("context")
    if not isinstance(context, Mapping):
        raise ConfigError(f"backbone {name!r}: config needs a context block (fps, height, width)")
    positive(context.get("fps"), "backbone.context.fps")
    for key in ("height", "width"):
        whole(context.get(key), f"backbone.context.{key}", 1)
    if "temporal_stride" in context:
        whole(context["temporal_stride"], "backbone.context.temporal_stride", 1)


def check_scorer(scorer: Mapping[str, Any]) -> None:
    """The scorer knobs CMBench reads before building it (the stages check their own)."""
    _name(scorer, "scorer")
    if "batch_size" in scorer:
        whole(scorer["batch_size"], "scorer.batch_size", 1)
    if "min_box_size" in scorer:
        positive(scorer["min_box_size"], "scorer.min_box_size", strict=False)
    aggregation = scorer.get("reference_aggregation", "mean")
    if aggregation not in REFERENCE_AGGREGATIONS:
        raise ConfigError(f"scorer.reference_aggregation={aggregation!r}: expected one of "
                          f"{', '.join(REFERENCE_AGGREGATIONS)}")


def selection(cfg: Mapping[str, Any], data_name: str) -> Selection:
    """Read and check ``seed``, ``limit``, ``sample_seed``, ``task_ids`` / ``subset``, ``shard`` (or
    torchrun's ``WORLD_SIZE`` / ``RANK``, a Slurm array's ``SLURM_ARRAY_TASK_COUNT`` / ``_ID``) and
    ``keep_other_code``.

    Raises
    ------
    ConfigError
        One line naming the knob, its value and what is expected.
    """
    ids = cfg.get("task_ids")
    if isinstance(ids, str):
        ids = [ids]
    elif ids is not None and not isinstance(ids, (list, tuple, ListConfig)):
        raise ConfigError(f"task_ids={ids!r}: expected a list of task ids, e.g. task_ids=[syn_001_reappear_01]")
    subset_name = cfg.get("subset")
    if subset_name is not None:
        if ids is not None:
            raise ConfigError(f"subset={subset_name} and task_ids both select tasks: set one of them")
        subset = load_subset(str(subset_name))
        if subset.dataset != data_name:
            raise ConfigError(f"subset={subset_name} lists {subset.dataset} tasks ({subset.path}), not {data_name}'s")
        other_world = subset.mismatch(cfg.get("data") or {})
        if other_world:
            raise ConfigError(f"subset={subset_name} ({subset.path}) lists the tasks of another world: {other_world}; "
                              "select tasks on this data with limit=N or task_ids=[...]")
        ids = list(subset.task_ids)
    shard_cfg = cfg.get("shard") or {}
    sequence = parallel_spec(cfg).sequence
    count = whole(shard_cfg.get("count", 1), "shard.count", 1, what="a whole number of shards >= 1")
    index = whole(shard_cfg.get("index", 0), "shard.index", 0, what="a whole shard number >= 0")
    array = flag(shard_cfg.get("slurm_array", True), "shard.slurm_array")
    try:
        shard = shard_from_env(int(count or 1), int(index or 0), sequence, array)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"shard.count / shard.index (or WORLD_SIZE / RANK): expected whole numbers ({err})") from err
    check_shard(*shard)
    return Selection(
        seed=whole(cfg.get("seed"), "seed", 0, maximum=MAX_SEED) or 0,
        limit=whole(cfg.get("limit"), "limit", 1, optional=True,
                    what="a positive whole number of tasks (or null for all)"),
        sample_seed=whole(cfg.get("sample_seed", 0), "sample_seed", 0, maximum=MAX_SEED) or 0,
        task_ids=None if ids is None else tuple(str(i) for i in ids),
        shard=shard,
        keep_other_code=flag(cfg.get("keep_other_code", False), "keep_other_code"),
    )


def parallel_spec(cfg: Mapping[str, Any]) -> ParallelSpec:
    """The ``parallel`` block, checked."""
    block = cfg.get("parallel") or {}
    if not isinstance(block, Mapping):
        raise ConfigError(f"parallel={block!r}: expected a block with sequence and check_masks")
    return ParallelSpec(sequence=whole(block.get("sequence", 1), "parallel.sequence", 1,
                                       what="a whole number of ranks per model >= 1") or 1,
                        check_masks=flag(block.get("check_masks", False), "parallel.check_masks"))


def result_config(plain: Mapping[str, Any], method: Method | None = None) -> dict[str, Any]:
    """The resolved config minus task selection, display and where components run: what changes a record
    (the method as its name and the knobs that differ from its class, :func:`canonical_method_config`;
    ``method``: the method already built from ``plain["method"]``).

    Root keys of role ``selection`` go, and so do the ``runtime`` keys of the backbone and the scorer
    (memory offloads, scorer device, batch size, cache folder; the scorer's effective precision is in
    its own hash, which every record carries).
    """
    out = {k: v for k, v in plain.items() if k not in SELECTION_KEYS and k != "hydra"}
    for group, schema in (("backbone", BACKBONE_KEYS), ("scorer", SCORER_KEYS)):
        if isinstance(out.get(group), dict):
            runtime = set(keys_with_role(schema, "runtime"))
            out[group] = {k: v for k, v in out[group].items() if k not in runtime}
    if isinstance(out.get("method"), dict):  # a method setting hashes the same however it was spelled
        out["method"] = canonical_method_config(out["method"], method)
    storage = storage_format(out.pop("storage", None))
    if storage.name == "lowrank":  # its basis hashes by content
        storage = lowrank_basis(storage, out.get("backbone") or {})
    if storage.quantized:  # full precision hashes as before storage formats existed
        out["storage"] = storage.knobs(file_fingerprint)
    dtype = cache_dtype_spec(out.pop("cache", None))
    if dtype is not None:  # the model's own precision hashes as before cache.dtype existed
        out["cache"] = {"dtype": dtype}
    return out


def run_identity(cfg: DictConfig, plain: Mapping[str, Any], method: Method) -> RunIdentity:
    """Label, config hash and setup hash of a run (``plain``: ``cfg`` resolved to plain values)."""
    config = result_config(plain, method)
    hashed = portable(config)
    return RunIdentity(label=run_label(cfg), config_hash=config_hash(hashed),
                       setup_hash=config_hash({k: v for k, v in hashed.items() if k != "seed"}),
                       result_config=config)


def _resolved(cfg: DictConfig, key: str | None = None) -> Any:
    """``cfg`` (or its ``key``) as plain values, or a one-line error when it does not resolve."""
    try:
        value = cfg if key is None else cfg.get(key)
        return to_dict(value) if isinstance(value, DictConfig) else value
    except Exception as err:  # an interpolation that does not resolve, a missing mandatory value
        raise ConfigError(f"the config does not resolve: {str(err).splitlines()[0]}") from err


def resolve_run(cfg: DictConfig, target_fields: Mapping[str, Any] | None = None) -> RunSpec:
    """Resolve and check a composed root config into a :class:`RunSpec` (nothing is loaded or written).

    ``method.target_pr`` must already be resolved into the method's calibrated knob (the entrances call
    :func:`cmbench.calibration.target_pr.resolve_target_pr` first and pass its ``record_fields()`` as
    ``target_fields``); an unresolved one is refused by the method's build.

    Raises
    ------
    ConfigError
        One line naming the first bad key (every group: selection, data, backbone, method, scorer,
        generation, outputs), or the method's own refusal of a knob.
    """
    plain = _resolved(cfg)
    check_known_keys(plain)
    for group in ("data", "backbone", "method", "scorer", "generation"):
        if not isinstance(plain.get(group), dict):
            raise ConfigError(f"{group}: missing from the config (choose one with {group}=<name>)")
        check_finite(plain[group], group)
    data = data_spec(plain["data"])
    chosen = selection(plain, data.name)
    check_backbone(plain["backbone"])
    check_scorer(plain["scorer"])
    method_cfg = plain["method"]
    method = build_method(method_cfg)  # the one build of a run: its knob checks come first
    generation = generation_spec(plain["generation"])
    storage = storage_spec(plain.get("storage"), plain["backbone"])
    check_format_for_method(type(method), storage)
    generation = replace(generation, settings=replace(generation.settings, storage=storage,
                                                      cache_dtype=cache_dtype_spec(plain.get("cache"))))
    check_settings(method, generation.settings)
    identity = run_identity(cfg, plain, method)
    method_name = str(method_cfg.get("name") or method.name)
    out_dir = Path(str(plain.get("out_dir") or "runs"))
    run_dir = out_dir / path_component(data.name, "data.name") / "__".join([
        path_component(method_name, "method.name"),
        path_component(plain["backbone"]["name"], "backbone.name"),
        path_component(plain["scorer"]["name"], "scorer.name"), identity.config_hash])
    outputs = Outputs(
        out_dir=out_dir, run_dir=run_dir,
        save_videos=flag(plain.get("save_videos", True), "save_videos"),
        lossless_max_pixels=whole(plain.get("lossless_max_pixels") or 0, "lossless_max_pixels", 0) or 0,
        progress=flag(plain.get("progress", True), "progress"),
        progress_every=whole(plain.get("progress_every", 10), "progress_every", 1,
                             what="a whole number of tasks >= 1") or 10,
        progress_seconds=positive(plain.get("progress_seconds", 60.0), "progress_seconds",
                                  what="a number of seconds > 0"),
        threads=thread_count(plain.get("threads")),
        tracker=plain.get("logging"),
    )
    score_source = str(plain.get("score_source") or "frames")
    if score_source not in SCORE_SOURCES:
        raise ConfigError(f"score_source={score_source!r}: expected one of {', '.join(SCORE_SOURCES)}")
    targets = dict(target_fields) if target_fields is not None else {
        "target_pr": method_cfg.get("quota_pr"), "calibration_pr": None}
    return RunSpec(data=data, backbone=plain["backbone"], method=method, method_name=method_name,
                   method_config=full_method_config(method_cfg, method), scorer=plain["scorer"],
                   generation=generation, selection=chosen, outputs=outputs, identity=identity,
                   parallel=parallel_spec(plain), score_source=score_source, target_fields=targets)


def resolve_scoring(cfg: DictConfig) -> ScoreSpec:
    """Resolve and check ``score``'s config (``videos``, ``data``, ``scorer``, ``out``, ``label``) into a
    :class:`ScoreSpec`, with the same checks of the data and scorer groups as :func:`resolve_run`
    (nothing is loaded or written).

    Raises
    ------
    ConfigError
        One line naming the first bad key.
    """
    plain = {key: _resolved(cfg, key) for key in ("videos", "data", "scorer", "out", "label")}  # what score reads
    videos = plain.get("videos")
    if not videos:
        raise ConfigError("score needs videos=DIR, a folder of <task_id>.mkv / <task_id>.mp4 continuations")
    if not isinstance(plain.get("scorer"), dict):
        raise ConfigError("score needs a scorer config: scorer=light (CPU) or scorer=owl_sam_dino (paper protocol)")
    if not isinstance(plain.get("data"), dict):
        raise ConfigError("data: missing from the config (choose one with data=<name>)")
    for group in ("data", "scorer"):
        check_finite(plain[group], group)
    data = data_spec(plain["data"])
    check_scorer(plain["scorer"])
    out, label = plain.get("out"), plain.get("label")
    if label:
        check_label(str(label))
    return ScoreSpec(data=data, scorer=plain["scorer"], videos=Path(str(videos)),
                     out=Path(str(out)) if out else None, label=str(label) if label else None)


def run_dir_for(cfg: DictConfig) -> Path:
    """``<out_dir>/<data>/<method>__<backbone>__<scorer>__<hash>``: readable, stable, no timestamp, and
    without the label (relabelling a run reruns nothing)."""
    return resolve_run(cfg).run_dir


def data_dir(cfg: Any) -> Path:
    """``<out_dir>/<data>``: where the runs (and the default leaderboard) of one dataset live."""
    return Path(str(cfg.out_dir)) / path_component(cfg.data.name, "data.name")

