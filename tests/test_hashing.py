"""Hashes that name stored things (videos in score caches, MiniWorld's build tree) keep their values: a change
would orphan every cache entry and rebuild every world, so they are pinned to values computed once."""

from __future__ import annotations

import numpy as np
import pytest

from cmbench.hashing import frames_hash, sequence_seed

VIDEO = np.arange(2 * 3 * 4 * 3, dtype=np.uint8).reshape(2, 3, 4, 3)


def test_a_videos_hash_is_pinned_and_the_same_for_any_batching():
    assert frames_hash([VIDEO]) == frames_hash([VIDEO[:1], VIDEO[1:]]) == "4f1bf1e7e3e39edb3818d4cfecd4d130"
    assert frames_hash([VIDEO[:1]]) != frames_hash([VIDEO])  # the frame count is part of it


def test_batches_of_another_frame_shape_or_dtype_and_no_frames_are_refused_naming_both():
    with pytest.raises(ValueError, match=r"^frame batches differ: \|u1 \(3, 4, 3\) then <u2 \(3, 4, 3\)$"):
        frames_hash([VIDEO[:1], VIDEO[1:].astype("<u2")])
    with pytest.raises(ValueError, match=r"^no frames to hash$"):
        frames_hash([])


def test_miniworlds_seeds_are_pinned():
    assert (sequence_seed(0, 7), sequence_seed(3)) == (1369798745, 1576890651)
