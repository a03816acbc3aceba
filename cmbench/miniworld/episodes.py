"""Episodes: a context camera path of 6 clips with target events, and one continuation per task.

A context is ``clips`` (6) clips of ``clip_frames`` (32) frames. Each clip is a dwell at the
current place followed by pans (4 or 8 px/frame) to one or more stops, each with a dwell. Three
kinds of clip:

- **reappear event** (target T): pan to T, hold on it, move on to a non-target place;
- **revisit event** (target B): starting at place A, pan A -> B, hold, pan back B -> A;
- **filler**: tours non-target places, preferring the twins of the targets (same category,
  other appearance: the distractors) and places seen before (returns).

A target is first seen in its event clip (a revisit target only there; a later filler may pass a
reappear target again), never in the sink (first ``sink_frames`` frames) nor in the last
``min_absence_frames`` frames (the last clip holds no event and avoids all targets), so neither a
sink nor a recent-window cache holds it. The continuation (``continuation_frames`` frames) starts
where the context ends (centred on a place), pans by the shorter way to the target and holds on it
for at least ``min_target_frames`` frames. Plans are drawn by rejection from a seeded generator and
every constraint is verified on the renderer's exact visibility, so a returned episode satisfies
all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet

import numpy as np

from cmbench.miniworld.camera import SPEEDS, pan, ring_delta, shortest_direction
from cmbench.miniworld.render import visible_pixels
from cmbench.miniworld.scene import CAMERA_STEP, PLACE_WIDTH, Scene

TASK_TYPES = ("reappear", "revisit")
JITTERS = (-CAMERA_STEP, 0, CAMERA_STEP)  # a dwell rests within one token step of a place's centre
MAX_ATTEMPTS = 500
MAX_PAN_PLACES = 3  # longest pan within a clip, in places
FILLER_END_RESERVE = 12  # frames a filler clip keeps free for its last stop


@dataclass(frozen=True)
class EpisodeConfig:
    """Shape of an episode (all in frames).

    Attributes
    ----------
    clips : int
        Clips per context (official: 6).
    clip_frames : int
        Frames per clip.
    continuation_frames : int
        Frames of each task's continuation.
    sink_frames : int
        Leading frames a sink cache keeps; no target may be visible in them.
    recent_window_frames : int
        Trailing frames a recent-window cache keeps; no target may be visible in them.
    min_absence_frames : int
        No target may be visible in the last this-many context frames (>= ``recent_window_frames``).
    min_target_frames : int
        Continuation frames that must show the whole target.
    """

    clips: int = 6
    clip_frames: int = 32
    continuation_frames: int = 16
    sink_frames: int = 4
    recent_window_frames: int = 8
    min_absence_frames: int = 32
    min_target_frames: int = 4

    def __post_init__(self) -> None:
        if self.clips < 2 or self.clip_frames < 16:
            raise ValueError("an episode needs at least 2 clips of at least 16 frames")
        if self.min_absence_frames < self.recent_window_frames:
            raise ValueError("min_absence_frames must be >= recent_window_frames")
        if self.min_absence_frames > self.clip_frames:
            raise ValueError("min_absence_frames cannot exceed one clip (the last clip holds no event)")
        if not 1 <= self.min_target_frames < self.continuation_frames:
            raise ValueError("min_target_frames must be in [1, continuation_frames)")

    @property
    def context_frames(self) -> int:
        return self.clips * self.clip_frames

    @property
    def reach_places(self) -> int:
        """How many places away a continuation can start (the context ends centred on a place) and
        still hold on the target for ``min_target_frames`` frames."""
        return (self.continuation_frames - self.min_target_frames) * max(SPEEDS) // PLACE_WIDTH


@dataclass(frozen=True, eq=False)
class TaskPlan:
    """One task of an episode.

    Attributes
    ----------
    task_type : {"reappear", "revisit"}
    target_id : int
        Object id (= place) of the target.
    event_clip : int
        The clip in which the target is seen.
    reference_frame : int
        Context frame showing the whole target (middle of its longest full view).
    continuation_x : ndarray, ``int64 [continuation_frames]``
        Camera plan of the continuation.
    direction : int
        +1 if the continuation pans right, -1 left.
    """

    task_type: str
    target_id: int
    event_clip: int
    reference_frame: int
    continuation_x: np.ndarray
    direction: int


@dataclass(frozen=True, eq=False)
class Episode:
    """A context and its tasks.

    Attributes
    ----------
    context_x : ndarray, ``int64 [clips * clip_frames]``
        Camera offset of every context frame.
    clip_prompts : tuple of str
        One description per clip of what the camera does and sees.
    tasks : tuple of TaskPlan
    """

    context_x: np.ndarray
    clip_prompts: tuple[str, ...]
    tasks: tuple[TaskPlan, ...]


def allocate_tasks(
    n_contexts: int, n_reappear: int, n_revisit: int, rng: np.random.Generator, max_per_context: int
) -> list[list[str]]:
    """Spread task types over contexts so that the totals are exact.

    Every context gets ``n_tasks // n_contexts`` tasks and ``n_tasks % n_contexts`` of them (chosen
    by ``rng``) one more; revisits then go one at a time to the context with the fewest revisits so
    far that still has a free slot (ties in a seeded order), the remaining slots are reappear.

    Returns
    -------
    list of ``n_contexts`` lists of task types (revisits first).
    """
    n_tasks = n_reappear + n_revisit
    if n_contexts < 1 or n_reappear < 0 or n_revisit < 0:
        raise ValueError("need at least one context and non-negative task counts")
    if not n_contexts <= n_tasks <= n_contexts * max_per_context:
        raise ValueError(
            f"{n_tasks} tasks cannot be spread over {n_contexts} contexts with 1..{max_per_context} tasks each"
        )
    per_context = np.full(n_contexts, n_tasks // n_contexts)
    order = rng.permutation(n_contexts)
    per_context[order[: n_tasks % n_contexts]] += 1
    revisits = np.zeros(n_contexts, dtype=int)
    for _ in range(n_revisit):
        free = [c for c in order if revisits[c] < per_context[c]]
        revisits[min(free, key=lambda c: revisits[c])] += 1
    return [["revisit"] * int(v) + ["reappear"] * int(t - v) for t, v in zip(per_context, revisits)]


def place_distance(a: int, b: int, n_places: int) -> int:
    """Ring distance between two places."""
    d = (a - b) % n_places
    return min(d, n_places - d)


@dataclass(frozen=True, eq=False)
class _Stop:
    """A pan (``moves``, offsets after the start) to a place, then a dwell of at least ``min_dwell``."""

    place: int
    offset: int
    direction: int
    speed: int
    moves: np.ndarray
    min_dwell: int

    @property
    def cost(self) -> int:
        """Fewest frames the stop takes."""
        return len(self.moves) + self.min_dwell


class _Planner:
    """One attempt at planning an episode (see :func:`plan_episode`)."""

    def __init__(self, scene: Scene, cfg: EpisodeConfig, rng: np.random.Generator):
        self.scene, self.cfg, self.rng = scene, cfg, rng
        self.n = scene.n_places
        self.table = visible_pixels(scene, np.arange(0, scene.width, CAMERA_STEP))  # [W / 4, n_objects]
        self.mentioned: set[int] = set()

    # -- geometry ---------------------------------------------------------------------------
    def offset(self, place: int) -> int:
        return (self.scene.place_offset(place) + int(self.rng.choice(JITTERS))) % self.scene.width

    def touches(self, offsets: np.ndarray, objects: set[int]) -> bool:
        """Whether any of ``objects`` shows a pixel along ``offsets``."""
        if not objects or len(offsets) == 0:
            return False
        return bool(self.table[np.asarray(offsets) // CAMERA_STEP][:, sorted(objects)].any())

    def stop(
        self,
        start: int,
        place: int,
        avoid: set[int],
        min_dwell: int,
        offset: int | None = None,
        direction: int | None = None,
    ) -> _Stop | None:
        """A pan from offset ``start`` to ``place`` that shows nothing of ``avoid`` (None if impossible).

        The stop rests at ``offset`` (default: the place's centre, jittered by up to one token step);
        the pan goes in ``direction`` (default: the shorter way, else the other way).
        """
        stop = self.offset(place) if offset is None else offset
        directions = [direction] if direction else [shortest_direction(start, stop, self.scene.width)]
        if direction is None:
            directions.append(-directions[0])
        for d in directions:
            distance = ring_delta(start, stop, self.scene.width, d)
            if distance > MAX_PAN_PLACES * PLACE_WIDTH + CAMERA_STEP:
                continue
            speed = max(SPEEDS) if distance > PLACE_WIDTH + CAMERA_STEP else int(self.rng.choice(SPEEDS))
            moves = pan(start, stop, speed, d, self.scene.width)
            if not self.touches(moves, avoid):
                return _Stop(place, stop, d, speed, moves, min_dwell)
        return None

    def pick(
        self,
        start: int,
        places: list[int],
        avoid: set[int],
        min_dwell: int,
        budget: int,
        favour: AbstractSet[int] = frozenset(),
        centred: bool = False,
    ) -> _Stop | None:
        """A random feasible stop among ``places`` costing at most ``budget`` frames (those in
        ``favour`` three times as likely); ``centred`` stops rest exactly on the place's centre."""
        stops = (self.stop(start, p, avoid, min_dwell, self.scene.place_offset(p) if centred else None) for p in places)
        feasible = [s for s in stops if s is not None and s.cost <= budget]
        if not feasible:
            return None
        weights = np.array([3.0 if s.place in favour else 1.0 for s in feasible])
        return feasible[int(self.rng.choice(len(feasible), p=weights / weights.sum()))]

    # -- clips ------------------------------------------------------------------------------
    def compose(self, start: int, stops: list[_Stop], first_dwell: int) -> np.ndarray | None:
        """Offsets of one clip: a dwell at ``start``, then pan + dwell per stop (None if too long)."""
        minimum = [first_dwell] + [s.min_dwell for s in stops]
        free = self.cfg.clip_frames - first_dwell - sum(s.cost for s in stops)
        if free < 0:
            return None
        dwells = np.asarray(minimum) + self.rng.multinomial(free, np.full(len(minimum), 1 / len(minimum)))
        parts = [np.full(dwells[0], start)]
        for s, dwell in zip(stops, dwells[1:]):
            parts += [s.moves, np.full(dwell, s.offset)]
        return np.concatenate(parts).astype(np.int64)

    def phrase_object(self, place: int) -> str:
        obj = self.scene.object_at(place)
        article = "the" if obj.object_id in self.mentioned else ("an" if obj.description[0] in "aeiou" else "a")
        self.mentioned.add(obj.object_id)
        return f"{article} {obj.description}"

    def prompt(self, start: int, stops: list[_Stop], first_clip: bool) -> str:
        pace = {min(SPEEDS): "slowly", max(SPEEDS): "quickly"}
        words = [f"The camera rests on {self.phrase_object(round(start / PLACE_WIDTH))}"]
        for s in stops:
            side = "right" if s.direction > 0 else "left"
            words.append(f"pans {side} {pace[s.speed]} to {self.phrase_object(s.place)} and holds on it")
        text = ", then ".join(words) + "."
        if first_clip:
            text = f"A wrap-around panorama over {self.scene.background}. " + text
        return text

    # -- the episode ------------------------------------------------------------------------
    def plan(self, task_types: list[str]) -> Episode | None:
        """Draw targets and event clips, then build the context clip by clip (None on a dead end)."""
        cfg, rng, n = self.cfg, self.rng, self.n
        self.task_types = task_types
        self.targets = [int(p) for p in rng.choice(n, size=len(task_types), replace=False)]
        self.free_places = [p for p in range(n) if p not in self.targets]
        slots = sorted(int(c) for c in rng.choice(cfg.clips - 1, size=len(task_types), replace=False))
        self.event_of_clip = {clip: i for i, clip in enumerate(slots)}  # clip -> task index
        self.seen_events: dict[int, int] = {}  # task index -> clip, filled as clips are built
        self.twin_places = {t for tgt in self.targets for t in self.scene.twins(tgt)} - set(self.targets)

        homes = self.end_places(-1)
        if not homes:
            return None
        at = self.offset(homes[int(rng.integers(len(homes)))])
        path, prompts = [], []
        for clip in range(cfg.clips):
            first_dwell = cfg.sink_frames if clip == 0 else 2
            start_place = round(at / PLACE_WIDTH) % n
            task = self.event_of_clip.get(clip)
            ends = [p for p in self.end_places(clip) if p != start_place or task is not None]
            budget = cfg.clip_frames - first_dwell
            if task is None:
                stops = self.filler_stops(clip, at, start_place, ends, budget)
            elif task_types[task] == "reappear":
                stops = self.reappear_stops(clip, at, self.targets[task], ends, budget)
            else:
                stops = self.revisit_stops(clip, at, start_place, self.targets[task], ends)
            offsets = self.compose(at, stops, first_dwell) if stops else None
            if not stops or offsets is None:
                return None
            prompts.append(self.prompt(at, stops, clip == 0))
            path.append(offsets)
            at = int(offsets[-1])
            if task is not None:
                self.seen_events[task] = clip
        context_x = np.concatenate(path)
        tasks = []
        for i, (task_type, target) in enumerate(zip(task_types, self.targets)):
            plan = self.task_plan(context_x, task_type, target, self.seen_events[i])
            if plan is None:
                return None
            tasks.append(plan)
        return Episode(context_x, tuple(prompts), tuple(tasks))

    def end_places(self, clip: int) -> list[int]:
        """Where clip ``clip`` may end so that the next clip (or the continuation) can start.

        The last clip ends within reach of every target; a clip before a revisit event ends one
        or two places from its target (the A of A -> B -> A); ``clip = -1`` asks for the home place.
        """
        nxt = self.event_of_clip.get(clip + 1)
        if clip == self.cfg.clips - 1:
            reach = self.cfg.reach_places
            return [p for p in self.free_places if all(place_distance(p, t, self.n) <= reach for t in self.targets)]
        if nxt is not None and self.task_types[nxt] == "revisit":
            return [p for p in self.free_places if place_distance(p, self.targets[nxt], self.n) in (1, 2)]
        return self.free_places

    def avoid_in(self, clip: int, own: int | None = None) -> set[int]:
        """Targets a route of ``clip`` must not show: all of them in the last clip, else all but the
        clip's own target and the reappear targets already seen (passing those again is harmless)."""
        if clip == self.cfg.clips - 1:
            return set(self.targets)
        seen = {self.targets[t] for t in self.seen_events if self.task_types[t] == "reappear"}
        return set(self.targets) - seen - {own}

    def filler_stops(self, clip: int, at: int, start_place: int, ends: list[int], budget: int) -> list[_Stop] | None:
        """Up to two stops at non-target places (favouring the targets' twins), then an end place."""
        avoid, stops, place = self.avoid_in(clip), [], start_place
        for _ in range(int(self.rng.integers(0, 3))):
            middle = [p for p in self.free_places if p != place]
            s = self.pick(at, middle, avoid, 2, budget - FILLER_END_RESERVE, favour=self.twin_places)
            if s is None:
                break
            stops.append(s)
            at, place, budget = s.offset, s.place, budget - s.cost
        last = clip == self.cfg.clips - 1
        end = self.pick(at, [p for p in ends if p != place], avoid, 2, budget, self.twin_places, centred=last)
        return [*stops, end] if end else None

    def reappear_stops(self, clip: int, at: int, target: int, ends: list[int], budget: int) -> list[_Stop] | None:
        """Pan to the target, hold at least 5 frames, move on to an end place."""
        avoid = self.avoid_in(clip, target)
        to_target = self.stop(at, target, avoid, 5)
        if to_target is None:
            return None
        onwards = self.pick(to_target.offset, ends, avoid, 2, budget - to_target.cost)
        return [to_target, onwards] if onwards else None

    def revisit_stops(self, clip: int, at: int, start_place: int, target: int, ends: list[int]) -> list[_Stop] | None:
        """A -> B -> A: from the start place A (one or two places from B) to B and back to ``at``."""
        if place_distance(start_place, target, self.n) not in (1, 2) or start_place not in ends:
            return None
        avoid = self.avoid_in(clip, target)
        there = self.stop(at, target, avoid, 4)
        if there is None:
            return None
        back = self.stop(there.offset, start_place, avoid, 2, offset=at, direction=-there.direction)
        return [there, back] if back else None

    def task_plan(self, context_x: np.ndarray, task_type: str, target: int, event_clip: int) -> TaskPlan | None:
        """Verify one target's visibility in the context and plan its continuation."""
        cfg, area = self.cfg, self.scene.objects[target].area
        seen = self.table[context_x // CAMERA_STEP, target]
        clip_of_frame = np.arange(len(context_x)) // cfg.clip_frames
        # a revisit target is seen in its clip only; a reappear target first in its clip
        outside = clip_of_frame != event_clip if task_type == "revisit" else clip_of_frame < event_clip
        if seen[outside].any() or seen[: cfg.sink_frames].any() or seen[-cfg.min_absence_frames :].any():
            return None
        whole = (seen == area) & (clip_of_frame == event_clip)
        if whole.sum() < 3:
            return None
        reference = _middle_of_longest_run(whole)
        at, goal = int(context_x[-1]), self.scene.place_offset(target)
        direction = shortest_direction(at, goal, self.scene.width)
        distance = ring_delta(at, goal, self.scene.width, direction)
        speed = max(SPEEDS) if distance > PLACE_WIDTH else int(self.rng.choice(SPEEDS))
        moves = pan(at, goal, speed, direction, self.scene.width)
        spare = cfg.continuation_frames - len(moves) - cfg.min_target_frames
        if spare < 0:
            return None
        lead = int(self.rng.integers(0, min(spare, 2) + 1))
        plan = np.concatenate([np.full(lead, at), moves, np.full(cfg.continuation_frames - lead - len(moves), goal)])
        plan = plan.astype(np.int64)
        if (self.table[plan // CAMERA_STEP, target] == area).sum() < cfg.min_target_frames:
            return None
        return TaskPlan(task_type, target, event_clip, reference, plan, direction)


def continue_prompt(task: TaskPlan, scene: Scene) -> str:
    """The continuation's prompt: where the camera goes, naming the target's category only (its
    appearance must come from memory)."""
    side = "right" if task.direction > 0 else "left"
    label = scene.objects[task.target_id].category
    if task.task_type == "reappear":
        return f"The camera pans {side} back to the {label} it saw earlier and holds on it."
    return f"The camera pans {side} back to the {label} it visited on its detour and holds on it."


def _middle_of_longest_run(flags: np.ndarray) -> int:
    """Index at the middle of the longest run of True values (first such run on ties)."""
    best, best_len, start = 0, 0, None
    for i, flag in enumerate([*flags.tolist(), False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start > best_len:
                best, best_len = start + (i - start) // 2, i - start
            start = None
    return best


def plan_episode(
    scene: Scene, task_types: list[str], rng: np.random.Generator, cfg: EpisodeConfig = EpisodeConfig()
) -> Episode:
    """Plan a context and one continuation per task over a scene.

    Parameters
    ----------
    scene : Scene
    task_types : list of {"reappear", "revisit"}
        One entry per task; each task gets its own target object.
    rng : numpy.random.Generator
    cfg : EpisodeConfig

    Returns
    -------
    Episode
        ``tasks[i]`` is the plan of ``task_types[i]``.

    Raises
    ------
    ValueError
        For an unknown task type, or more tasks than the scene and the clip count can hold.
    RuntimeError
        If no valid plan was found in ``MAX_ATTEMPTS`` tries (does not happen for the default geometry).
    """
    unknown = set(task_types) - set(TASK_TYPES)
    if unknown or not task_types:
        raise ValueError(f"task types must be a non-empty list of {TASK_TYPES}, got {task_types}")
    if len(task_types) > min(cfg.clips - 1, scene.n_places - 2):
        raise ValueError(f"{len(task_types)} tasks do not fit {cfg.clips} clips over {scene.n_places} places")
    for _ in range(MAX_ATTEMPTS):
        episode = _Planner(scene, cfg, rng).plan(list(task_types))
        if episode is not None:
            return episode
    raise RuntimeError(f"no episode plan found for {task_types} in {MAX_ATTEMPTS} attempts")
